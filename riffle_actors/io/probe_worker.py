"""The disk probe worker process: runs probes for one disk, one at a time, on pipes its owner made.

Started by ``riffle_actors.io.probe_fleet.ProbeFleet`` as
``python -P -m riffle_actors.io.probe_worker REQUEST_FD REPLY_FD OWNER_PID``. It owns nothing
but its two pipe ends, inherited from the owner (the server process) and open nowhere else:

- ``REQUEST_FD`` (read): one JSON object per line, ``{"op": "probe", "seq": n, "root": path,
  "fn": "module:qualname"}``. ``fn`` names a module-level probe function, which the worker
  imports and calls with ``root``;
- ``REPLY_FD`` (write): one JSON object per line, ``{"op": "ready", "pid": n}`` once at start,
  then ``{"op": "result", "seq": n, "result": {ProbeResult fields}}`` per probe.

JSON, not pickle: nothing the worker reads, or the owner reads back, can run code when it is
decoded, and no socket is opened at all.

It exits:

- when the owner closes the request pipe or dies (EOF on ``REQUEST_FD``), or when the reply pipe
  is gone;
- at once, by SIGKILL, when the thread of the owner that started it ends (``PR_SET_PDEATHSIG``,
  Linux). This also covers a probe stuck in the kernel, which never gets back to read the pipe.

SIGINT is ignored: a Ctrl-C on the terminal is for the server, which shuts its workers down.

Keep the imports light and free of side effects: this module's start-up time is the worker's.

See also: ``riffle_actors.io.probe`` (the probe), ``riffle_actors.io.probe_fleet`` (the owner side).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from riffle_actors.io.local import classify
from riffle_actors.io.probe import ProbeResult

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def encode(msg: dict[str, Any]) -> bytes:
    """One message on the wire: compact ASCII JSON and a newline (paths keep undecodable bytes as escapes)."""
    return json.dumps(msg, separators=(",", ":")).encode("ascii") + b"\n"


def result_to_json(result: ProbeResult) -> dict[str, Any]:
    return dataclasses.asdict(result)


def result_from_json(data: dict[str, Any]) -> ProbeResult:
    """The inverse of ``result_to_json``; a missing or unknown field raises ``ValueError``."""
    names = {f.name for f in dataclasses.fields(ProbeResult)}
    if set(data) != names:
        raise ValueError(f"probe result fields {sorted(data)} are not {sorted(names)}")
    return ProbeResult(**data)


def function_ref(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a module-level function, checked to resolve back to ``fn``.

    Raises ``ValueError`` for a lambda, a nested function, or one defined in ``__main__``."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or module in ("__main__", "__mp_main__") or "<" in qualname:
        raise ValueError(f"a probe function must be defined at module level of an importable module: {fn!r}")
    ref = f"{module}:{qualname}"
    if resolve(ref) is not fn:
        raise ValueError(f"probe function {fn!r} is not reachable as {ref}")
    return ref


def resolve(ref: str) -> Callable[..., Any]:
    module, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _die_with_owner(owner_pid: int) -> bool:
    """Ask the kernel to SIGKILL this process when the owner's thread ends; False if the owner is gone."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            print(f"riffle probe worker {os.getpid()}: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}",
                  file=sys.stderr)
    # the owner may have died before the request above: then this process was re-parented already
    return os.getppid() == owner_pid


def _run_probe(ref: str, root: str) -> ProbeResult:
    try:
        result = resolve(ref)(root)
        if not isinstance(result, ProbeResult):
            raise TypeError(f"probe function {ref} returned {type(result).__name__}, not a ProbeResult")
        return result
    except Exception as e:  # noqa: BLE001 - a probe reports, it never raises
        return ProbeResult(False, kind=classify(e).value, op="probe", detail=f"{type(e).__name__}: {e}")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def serve(request_fd: int, reply_fd: int) -> None:
    """Answer probe requests until EOF on ``request_fd``.

    A malformed request raises: a bug, shown on stderr; the owner sees the worker die."""
    _write_all(reply_fd, encode({"op": "ready", "pid": os.getpid()}))
    with open(request_fd, "rb", buffering=1 << 16, closefd=True) as requests:
        for line in requests:
            msg = json.loads(line)
            if msg.get("op") != "probe":
                raise ValueError(f"unexpected request {msg!r}")
            result = _run_probe(msg["fn"], msg["root"])
            reply = {"op": "result", "seq": msg["seq"], "result": result_to_json(result)}
            _write_all(reply_fd, encode(reply))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m riffle_actors.io.probe_worker REQUEST_FD REPLY_FD OWNER_PID", file=sys.stderr)
        return 2
    request_fd, reply_fd, owner_pid = (int(a) for a in args)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not _die_with_owner(owner_pid):
        return 0
    try:
        serve(request_fd, reply_fd)
    except BrokenPipeError:
        pass  # the owner closed the reply pipe: it does not want the answer any more
    return 0


if __name__ == "__main__":
    sys.exit(main())
