"""HTTP adapter of ``riffle_actors.profiling.Profiler``: Riffle's profiling URLs on the server's HTTP port.

- ``GET /debug/pprof/profile?seconds=5&frequency=100&format=svg|folded``: a sampling CPU profile of
  every thread, as an SVG flame graph (default) or folded stacks (``text/plain``, one
  ``stack count`` line each, the input of ``flamegraph.pl`` and speedscope).
- ``GET /debug/heap/profile?seconds=5&format=svg|folded``: Python allocations still held, weighted
  by bytes, in the same two forms.
- ``GET /await-tree``: what every actor and asyncio task is doing now (text).

The two profiles need the ``[admin]`` credentials (``transport.admin_auth.guard``): a profile costs
CPU and shows code paths. Bad parameters answer 400 naming the parameter and its bound, a second
profile of a kind while one runs answers 409 (as Riffle: one at a time). ``format=pprof`` (Riffle's
protobuf form) answers 400 saying to use ``svg`` or ``folded``.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from riffle_actors.credentials import AdminCredentials
from riffle_actors.profiling import Profile, Profiler, ProfilerBusy, render_flamegraph
from riffle_actors.transport.admin_auth import guard

_FORMATS = ("svg", "folded")


def _error(status: int, message: str) -> web.Response:
    return web.Response(body=orjson.dumps({"error": message}), status=status, content_type="application/json")


def _number(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw[:40]!r}") from None


def _render(profile: Profile, fmt: str, title: str) -> web.Response:
    if fmt == "folded":
        return web.Response(text=profile.to_folded_text(), content_type="text/plain")
    svg = render_flamegraph(profile.folded, title=title, unit=profile.unit)
    return web.Response(text=svg, content_type="image/svg+xml", headers={"X-Content-Type-Options": "nosniff"})


def add_profiling_routes(app: web.Application, profiler: Profiler, credentials: AdminCredentials) -> None:
    async def run(request: web.Request, kind: str) -> web.Response:
        fmt = request.query.get("format", "svg").lower()
        if fmt not in _FORMATS:
            return _error(400, f"format must be one of {', '.join(_FORMATS)} (pprof protobuf is not "
                               f"produced here), got {fmt[:40]!r}")
        try:
            seconds = _number(request, "seconds", 5)
            if kind == "cpu":
                frequency = _number(request, "frequency", 100)
                profile = await profiler.cpu_profile(seconds, frequency)
                title = f"riffle-server CPU, {seconds} s at {frequency} Hz, {profile.samples} samples"
            else:
                profile = await profiler.heap_profile(seconds)
                title = (f"riffle-server Python heap held, {profile.total:,} bytes in {profile.samples:,} "
                         f"allocations" + (f" made in {seconds} s" if profile.seconds else " since start"))
        except ProfilerBusy as e:
            return _error(409, str(e))
        except ValueError as e:
            return _error(400, str(e))
        return _render(profile, fmt, title)

    async def cpu(request: web.Request) -> web.Response:
        return await run(request, "cpu")

    async def heap(request: web.Request) -> web.Response:
        return await run(request, "heap")

    async def await_tree(_request: web.Request) -> web.Response:
        return web.Response(text=profiler.await_tree(), content_type="text/plain")

    app.router.add_get("/debug/pprof/profile", guard(credentials, cpu))
    app.router.add_get("/debug/heap/profile", guard(credentials, heap))
    app.router.add_get("/await-tree", await_tree)
