"""A headless Chromium driven over the DevTools protocol (aiohttp websocket; no selenium, no driver).

``Browser.start(tmp)`` runs Debian's ``chromium`` with ``--remote-debugging-port=0`` and a private
profile, reads the port it chose from ``DevToolsActivePort``, and attaches to its page. The page
collects every console message, uncaught exception and log entry at level error in ``errors``.
``close()`` kills the process (its own process group) and waits for it.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

from tests.helpers import poll_until

CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
    "--disable-dev-shm-usage", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
    "--window-size=1400,900",
]


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, proc: subprocess.Popen, session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse):
        self.proc = proc
        self.session = session
        self.ws = ws
        self.errors: list[str] = []
        self.console: list[str] = []
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, tmp: Path) -> Browser:
        binary = chromium_binary()
        assert binary is not None
        profile = tmp / "chromium-profile"
        profile.mkdir()
        with open(tmp / "chromium.log", "wb") as log:  # noqa: ASYNC230 - a local file, opened once
            proc = subprocess.Popen(  # noqa: ASYNC220 - starts at once; we then wait on its port file
                [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        session = aiohttp.ClientSession()
        try:
            port_file = profile / "DevToolsActivePort"
            await poll_until(lambda: proc.poll() is not None or port_file.exists() and port_file.read_text().strip(),
                             timeout=60, interval=0.05, message="chromium did not open its DevTools port")
            if proc.poll() is not None:
                raise AssertionError(f"chromium exited with {proc.returncode}: {(tmp / 'chromium.log').read_text()[-2000:]}")
            port = int(port_file.read_text().split()[0])
            targets: list[dict[str, Any]] = []

            async def page_target():
                nonlocal targets
                async with session.get(f"http://127.0.0.1:{port}/json/list") as r:
                    targets = [t for t in await r.json() if t.get("type") == "page"]
                return targets

            await poll_until(page_target, timeout=30, interval=0.05, message="no page target")
            ws = await session.ws_connect(targets[0]["webSocketDebuggerUrl"], max_msg_size=64 << 20)
        except BaseException:
            await session.close()
            _kill(proc)
            raise
        browser = cls(proc, session, ws)
        for domain in ("Runtime", "Log", "Page"):
            await browser.send(f"{domain}.enable")
        return browser

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = msg.json()
            if "id" in data:
                fut = self._pending.pop(data["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
                continue
            method, params = data.get("method"), data.get("params", {})
            if method == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                self.console.append(f"{params.get('type')}: {text}")
                if params.get("type") in ("error", "assert"):
                    self.errors.append(f"console.{params['type']}: {text}")
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                self.errors.append("exception: " + str(details.get("exception", {}).get("description")
                                                       or details.get("text")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                self.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = fut
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        reply = await asyncio.wait_for(fut, 30)
        if "error" in reply:
            raise AssertionError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def settled(self) -> None:
        """Return once every event the page emitted before now has been read: the page logs a marker
        from a task queued behind whatever the page already queued (timers, callbacks), and the
        marker's ``consoleAPICalled`` event, read in order from the one DevTools socket, is awaited."""
        marker = f"riffle-settled-{next(self._ids)}"
        await self.send("Runtime.evaluate", awaitPromise=True, expression=(
            f"new Promise(r => setTimeout(() => {{ console.debug({marker!r}); r(true); }}, 0))"))
        await poll_until(lambda: any(marker in line for line in self.console), timeout=30, interval=0.01,
                         message="the page's marker event never arrived")

    async def screenshot(self, path: Path) -> None:
        result = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(result["data"]))

    async def close(self) -> None:
        self._reader.cancel()
        try:
            await self.ws.close()
        finally:
            await self.session.close()
            _kill(self.proc)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # chromium's helpers live in the same new session
        except ProcessLookupError:
            pass
    proc.wait(30)
