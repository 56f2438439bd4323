"""The coordinator's status page in a real headless Chromium (Debian's package), against a real
coordinator and real servers: the page and its assets load with no console error or exception,
it lists the servers (status, memory, disks, apps), the apps and the history, and it refreshes
itself (a change in the cluster appears without a reload).

Set ``RIFFLE_STATUS_SCREENSHOT=docs/status-page.png`` to save the screenshot the docs show.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pb_grpc
from tests.browser.cdp import Browser, chromium_binary
from tests.ctl.cluster import ADMIN_TOKEN, RealCluster, http_json
from tests.helpers import poll_until

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    if chromium_binary() is None:
        pytest.skip("chromium is not installed (scripts/e2e_setup.sh installs Debian's chromium)")
    b = await Browser.start(tmp_path)
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture
def cluster(tmp_path: Path):
    c = RealCluster(tmp_path / "cluster")
    c.tmp.mkdir()
    try:
        c.start_coordinator()
        c.start_server("alpha")
        c.start_server("beta", min_disks=2)  # UNHEALTHY: asks for two healthy disks, has one
        c.wait_registered(2)
        yield c
    finally:
        c.stop()


def _register(cluster: RealCluster, app_id: str, user: str) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{cluster.coordinator.ports['grpc_port']}") as channel:
        stub = pb_grpc.CoordinatorServerStub(channel)
        stub.registerApplicationInfo(pb.ApplicationInfoRequest(appId=app_id, user=user))
        stub.getShuffleAssignments(pb.GetShuffleServerRequest(applicationId=app_id, shuffleId=0, partitionNum=8,
                                                              partitionNumPerRange=1, dataReplica=1))


async def test_status_page_shows_the_cluster(browser: Browser, cluster: RealCluster) -> None:
    ids = cluster.server_ids
    _register(cluster, "application_1764547200000_0001", "etl")  # expires (5 s) into the history
    await poll_until(lambda: http_json(cluster.url + "/api/historical_apps"), timeout=30)
    _register(cluster, "application_1764547200000_0002", "analytics")

    await browser.send("Page.navigate", url=cluster.url + "/")
    await poll_until(lambda: browser.evaluate("!!document.body && document.body.dataset.loaded === 'true'"), timeout=30, interval=0.1)

    async def rows(table: str, attr: str) -> list[str]:
        return await browser.evaluate(
            f"Array.from(document.querySelectorAll('#{table} tbody tr[{attr}]')).map(r => r.getAttribute('{attr}'))")

    async def both_servers_shown():
        return sorted(await rows("servers", "data-server-id")) == ids

    await poll_until(both_servers_shown, timeout=30, interval=0.1)
    text = await browser.evaluate("document.querySelector('#servers').innerText")
    assert "ACTIVE" in text and "UNHEALTHY" in text and "MiB" in text and "NORMAL" in text
    # grouped by host: both servers run on 127.0.0.1, under one host row (docs/workers.md)
    assert await rows("servers", "data-host") == ["127.0.0.1"]
    assert "host 127.0.0.1: 2 servers" in text
    assert await browser.evaluate("document.location.pathname") == "/ui/"
    assert "application_1764547200000_0001" in await rows("history", "data-app-id")

    async def live_app_shown():
        _register(cluster, "application_1764547200000_0002", "analytics")  # keep it alive
        return "application_1764547200000_0002" in await rows("apps", "data-app-id")

    await poll_until(live_app_shown, timeout=30, interval=0.2)
    alpha = next(s["id"] for s in http_json(cluster.url + "/api/servers") if "alpha" in s["tags"])
    apps_cell = f"document.querySelector('#servers tr[data-server-id=\"{alpha}\"]').children[4].innerText"
    assert int(await browser.evaluate(apps_cell)) >= 1  # the live app's shuffles were assigned to alpha

    # it refreshes itself: decommission a server and watch the page change without a reload
    http_json(f"{cluster.url}/api/servers/{alpha}/status", "POST", {"status": "DECOMMISSIONING"}, ADMIN_TOKEN)

    async def decommission_shown():
        return await browser.evaluate(
            f"document.querySelector('#servers tr[data-server-id=\"{alpha}\"]').innerText.includes('DECOMMISSIONING')")

    await poll_until(decommission_shown, timeout=30, interval=0.2)
    http_json(f"{cluster.url}/api/servers/{alpha}/status", "POST", {"status": "ACTIVE"}, ADMIN_TOKEN)
    await poll_until(lambda: browser.evaluate(
        f"!document.querySelector('#servers tr[data-server-id=\"{alpha}\"]').innerText.includes('DECOMMISSIONING')"),
        timeout=30, interval=0.2)
    _register(cluster, "application_1764547200000_0002", "analytics")
    await browser.settled()  # every console event and exception the page emitted so far has been read
    assert browser.errors == [], browser.errors
    shot = os.environ.get("RIFFLE_STATUS_SCREENSHOT")
    if shot:
        await poll_until(live_app_shown, timeout=30, interval=0.2)
        await browser.screenshot(Path(shot))


async def test_settled_reads_every_event_the_page_emitted_before_it(browser: Browser) -> None:
    """``Browser.settled()`` (what the status-page test drains Chromium with) does not return before
    the events of work the page had already queued have been read: three timers that throw, queued
    behind a console error, all arrive. Each timer keeps the page busy 150 ms before it throws, so a
    drain that only gives the test's loop a turn (or a fixed short wait) returns before they arrive."""
    await browser.send("Runtime.evaluate", expression=(
        "for (let i = 0; i < 3; i++) setTimeout(() => {"
        " const t = performance.now(); while (performance.now() - t < 150) {}"
        " throw new Error('queued ' + i); }, 0);"
        "console.error('at once')"))
    await browser.settled()
    assert browser.errors[0] == "console.error: at once", browser.errors
    assert [e.split("\n")[0] for e in browser.errors[1:]] == [f"exception: Error: queued {i}" for i in range(3)]
