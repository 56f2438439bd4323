"""Riffle's profiling URLs on a real ``riffle-server`` process: ``/debug/pprof/profile``,
``/debug/heap/profile`` and ``/await-tree``.

- Both profiles need the admin credentials: 403 with none configured, 401 with a wrong token.
- A CPU profile taken while a client writes shows the server's own code at work (idle threads are not sampled: only those whose CPU clock moved), and its SVG flame graph is well-formed; a real headless Chromium draws it
  (frames as rectangles, the root bar spanning the width).
- A heap profile taken during writes lists Python allocations of the server, weighted by bytes.
- Bounds as Riffle's: ``seconds`` over 60, ``frequency`` over 1000, a non-number or ``format=pprof``
  answer 400 naming the parameter; a second CPU profile while one runs answers 409.
- ``/await-tree`` lists every actor and the asyncio tasks with the frame each is suspended in.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Self

import pytest

from tests.ctl.cluster import ADMIN_TOKEN, RealCluster, send_blocks

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RealCluster]:
    c = RealCluster(tmp_path / "cluster")
    c.tmp.mkdir()
    try:
        c.start_coordinator()
        c.start_server("guarded", admin_token=ADMIN_TOKEN)
        c.start_server("open")  # no admin credentials configured
        c.wait_registered(2)
        yield c
    finally:
        c.stop()


def _get(port: int, path: str, token: str | None = ADMIN_TOKEN, timeout: float = 90) -> tuple[int, str, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


class _Writer:
    """Keeps sending blocks to a server from a thread until stopped, so a profile sees the send path."""

    def __init__(self, grpc_port: int) -> None:
        self.grpc_port = grpc_port
        self.stop = threading.Event()
        self.sends = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            send_blocks(self.grpc_port, f"app_profiled_{self.sends}", [bytes([self.sends % 251]) * 4096] * 16)
            self.sends += 1

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def test_profiles_need_the_admin_credentials(cluster: RealCluster) -> None:
    guarded, unconfigured = (s.ports["http_port"] for s in cluster.servers)
    for path in ("/debug/pprof/profile?seconds=1", "/debug/heap/profile?seconds=1"):
        assert _get(unconfigured, path)[0] == 403
        assert _get(guarded, path, token="wrong-token")[0] == 401
        assert _get(guarded, path, token=None)[0] == 401


def test_a_cpu_profile_shows_the_send_path_and_draws_a_flame_graph(cluster: RealCluster) -> None:
    server = cluster.servers[0]
    with _Writer(server.ports["grpc_port"]) as writer:
        status, kind, body = _get(server.ports["http_port"], "/debug/pprof/profile?seconds=3&frequency=200&format=folded")
        assert status == 200 and kind.startswith("text/plain"), body[:500]
        status_svg, kind_svg, svg = _get(server.ports["http_port"], "/debug/pprof/profile?seconds=1")
    assert writer.sends > 0
    lines = body.decode().splitlines()
    stacks = {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in lines}
    assert all(count > 0 for count in stacks.values())
    assert any(stack.startswith("MainThread;") for stack in stacks)  # the event loop's thread
    # the server's own code at work: actors on the loop thread, metadata appends on the disk threads
    # (most loop-thread samples sit in C, grpc core and uvloop, and show as asyncio.run)
    ours = [stack for stack in stacks
            if any(f"({room}/" in stack for room in ("actors", "runtime", "transport", "state", "io"))]
    assert ours, lines[:20]
    assert status_svg == 200 and kind_svg.startswith("image/svg+xml")
    root = ET.fromstring(svg)
    rects = root.findall(".//{http://www.w3.org/2000/svg}rect")
    assert len(rects) > 3
    assert "samples" in "".join(root.itertext())


def test_a_heap_profile_lists_held_python_allocations(cluster: RealCluster) -> None:
    server = cluster.servers[0]
    with _Writer(server.ports["grpc_port"]):
        status, _kind, body = _get(server.ports["http_port"], "/debug/heap/profile?seconds=2&format=folded")
    assert status == 200, body[:500]
    lines = body.decode().splitlines()
    assert lines and all(line.startswith("heap;") for line in lines)
    held = sum(int(line.rsplit(" ", 1)[1]) for line in lines)
    assert held > 0
    assert any(".py:" in line for line in lines)


def test_bad_parameters_and_a_second_profile_are_refused(cluster: RealCluster) -> None:
    port = cluster.servers[0].ports["http_port"]
    for query, word in [("seconds=61", "seconds"), ("seconds=0", "seconds"), ("frequency=5000", "frequency"),
                        ("seconds=abc", "seconds"), ("format=pprof", "format")]:
        status, _kind, body = _get(port, f"/debug/pprof/profile?{query}")
        assert status == 400 and word in body.decode(), (query, body)
    with ThreadPoolExecutor(2) as pool:  # two 5 s profiles asked at once: one runs, the other is refused
        answers = list(pool.map(lambda _: _get(port, "/debug/pprof/profile?seconds=5&format=folded"), range(2)))
    assert sorted(a[0] for a in answers) == [200, 409], [a[:2] for a in answers]
    assert b"already running" in next(a[2] for a in answers if a[0] == 409)


def test_the_await_tree_lists_actors_and_tasks(cluster: RealCluster) -> None:
    status, kind, body = _get(cluster.servers[1].ports["http_port"], "/await-tree", token=None)
    text = body.decode()
    assert status == 200 and kind.startswith("text/plain")
    assert "actor=app-manager" in text or "actor=" in text
    assert "task=" in text and ".py:" in text


@pytest.mark.asyncio
async def test_chromium_draws_the_flame_graph(cluster: RealCluster, tmp_path: Path) -> None:
    from tests.browser.cdp import Browser, chromium_binary
    from tests.helpers import poll_until

    if chromium_binary() is None:
        pytest.skip("chromium is not installed (scripts/e2e_setup.sh installs Debian's chromium)")
    server = cluster.servers[0]
    with _Writer(server.ports["grpc_port"]):
        status, _kind, svg = _get(server.ports["http_port"], "/debug/pprof/profile?seconds=1")
    assert status == 200
    page = tmp_path / "profile.svg"
    page.write_bytes(svg)
    browser = await Browser.start(tmp_path)
    try:
        await browser.send("Page.navigate", url=page.as_uri())
        await poll_until(lambda: browser.evaluate("document.readyState === 'complete'"), timeout=30, interval=0.1)
        drawn = await browser.evaluate(
            "(() => { const r = Array.from(document.querySelectorAll('rect')).map(e => e.getBBox());"
            " return {n: r.length, widest: Math.max(...r.map(b => b.width)), svg: document.documentElement.tagName}; })()")
        assert drawn["svg"] == "svg" and drawn["n"] > 3
        assert drawn["widest"] >= 1100  # the background and the "all" bar span the graph
        assert browser.errors == [], browser.errors
    finally:
        await browser.close()
