"""The simulation's deterministic event loop, in-process gRPC channel and holdable disk IO.

A seed must replay exactly: the same callbacks in the same order, so the same event trace. Three
things of an ordinary run are decided by the machine rather than the seed, and each is replaced here:

- **Time.** ``SimLoop.time()`` is virtual: it starts at 0 and moves only when the loop has nothing
  ready to run, straight to the next timer (``asyncio.sleep``, ``wait_for`` deadlines, ``call_later``).
  Nothing waits on the wall clock; a loop with nothing ready and no timer is stuck, and says so
  (``SimStalled``), as does a loop that turns ``MAX_TURNS`` times (something spins without waiting).
- **Threads.** ``run_in_executor`` (every disk's thread pools, the default executor) runs the function
  on the loop thread, one loop turn after the call, in call order. A held operation
  (``SimLocalIO.hold``) raises ``Postponed`` before it touches anything and runs again, from the
  start, once released, so a "hang" of the thread is a pause of that call only.
- **Sockets.** ``InProcessChannel`` is a ``grpc.aio``-shaped channel that hands each request to the
  server's real gRPC handlers (``ShuffleServer(serve_grpc=False).grpc_servicer``): the request is
  serialised by the client's stub, deserialised by the server's handler, and the reply the other way,
  as on a socket, but on the loop thread and in the caller's task.

The actor runtime's ``SliceLane`` measures its slices in CPU time (``time.perf_counter``); ``run``
sets ``riffle_actors.runtime.slicing.SLICE_S`` to infinity while a simulation runs, so a lane's
operation never yields part-way because the machine was slow (the simulation's operations are small).

See also: ``tests/sim/harness.py`` (the worlds and schedules that run on it).
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import grpc

from riffle_actors.io.faults import FaultRule, FaultyLocalIO
from riffle_actors.runtime import slicing

T = TypeVar("T")

MAX_TURNS = 5_000_000
"""Loop turns one simulation may take (a run of a seed takes ~20-60 thousand): beyond, something spins."""


class SimStalled(RuntimeError):
    """The simulation can make no progress: nothing to run and no timer, or a loop that spins."""


class _VirtualSelector(selectors.DefaultSelector):
    """Polls the real file descriptors without waiting; a wait for ``timeout`` s moves virtual time."""

    loop: SimLoop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise SimStalled("nothing is ready to run and no timer is set: every task waits for the others")
        self.loop.advance(timeout)
        return []


class SimLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on virtual time whose executor work runs on the loop; see the module docstring."""

    def __init__(self) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._virtual = 0.0
        self.turns = 0

    def time(self) -> float:
        return self._virtual

    def advance(self, seconds: float) -> None:
        self._virtual += seconds

    def _run_once(self) -> None:  # asyncio's private step, extended
        self.turns += 1
        if self.turns > MAX_TURNS:
            raise SimStalled(f"{MAX_TURNS} loop turns: something runs without ever waiting")
        super()._run_once()  # type: ignore[misc]

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:  # type: ignore[override]
        fut: asyncio.Future[T] = self.create_future()

        def run() -> None:
            if fut.cancelled():
                return
            try:
                result = func(*args)
            except Postponed as held:
                def again() -> None:
                    self.call_soon(run)

                held.gate.waiters.append(again)
                return
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as e:  # noqa: BLE001 - delivered to the awaiting code, as a thread's would be
                fut.set_exception(e)
                return
            fut.set_result(result)

        self.call_soon(run)
        return fut


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` on a fresh ``SimLoop`` (with CPU-time slicing off) and close the loop."""
    saved = slicing.SLICE_S
    slicing.SLICE_S = math.inf
    try:
        with asyncio.Runner(loop_factory=SimLoop) as runner:
            return runner.run(main())
    finally:
        slicing.SLICE_S = saved


# ---------------------------------------------------------------------------- holdable IO
@dataclass(eq=False)
class Gate:
    """``threading.Event``'s ``set``/``is_set`` for code on the loop thread; ``set`` wakes its waiters."""

    flag: bool = False
    waiters: list[Callable[[], None]] = field(default_factory=list)

    def set(self) -> None:
        self.flag = True
        waiters, self.waiters = self.waiters, []
        for wake in waiters:
            wake()

    def is_set(self) -> bool:
        return self.flag


class Postponed(Exception):
    """Raised by a held operation before it does anything; ``SimLoop`` runs it again once released."""

    def __init__(self, gate: Gate):
        super().__init__("held")
        self.gate = gate


@dataclass(eq=False)
class Held(FaultRule):
    """``FaultyLocalIO``'s ``Blocked`` for the simulation: ``entered`` and ``release`` are ``Gate`` s,
    and the operation is postponed (not blocked in a thread) until ``release`` is set."""

    entered: Gate = field(default_factory=Gate)
    release: Gate = field(default_factory=Gate)

    def fire(self, op: str) -> None:
        self.entered.set()
        if not self.release.is_set():
            if self.times is not None:
                self.times += 1  # the run after the release is this same operation, not a new one
            self.hits -= 1
            raise Postponed(self.release)
        super().fire(op)


class SimLocalIO(FaultyLocalIO):
    """``FaultyLocalIO`` whose ``hold`` pauses an operation on a ``SimLoop`` (its ``hang`` would block the loop)."""

    def hold(self, op: str, *, times: int = 1) -> Held:
        rule = Held(self._check(op), None, times)
        self._arm(rule)
        return rule

    def heal(self, op: str | None = None) -> None:
        held = [r for r in self.rules if isinstance(r, Held) and (op is None or r.op == op)]
        super().heal(op)
        for r in held:
            r.release.set()


# ---------------------------------------------------------------------------- in-process gRPC
class _CallDetails(NamedTuple):
    method: str
    invocation_metadata: tuple[Any, ...] = ()


class _Context:
    """What the servicer uses of ``grpc.aio.ServicerContext``: the peer, and ``write`` for streamed replies."""

    def __init__(self, peer: str):
        self._peer = peer
        self.written: list[Any] = []

    def peer(self) -> str:
        return self._peer

    async def write(self, message: Any) -> None:
        self.written.append(message)

    def invocation_metadata(self) -> tuple[Any, ...]:
        return ()


class InProcessChannel:
    """A ``grpc.aio`` channel (the part a generated stub uses) onto a server's handlers; see the module docstring.

    ``on_reply(method, reply)`` sees every reply (the simulation's trace records its status)."""

    def __init__(self, handler: grpc.GenericRpcHandler, *, peer: str = "ipv4:127.0.0.1:50000",
                 on_reply: Callable[[str, Any], None] | None = None):
        self.handler = handler
        self.peer = peer
        self.on_reply = on_reply

    def unary_unary(self, method: str, request_serializer: Callable[[Any], bytes],
                    response_deserializer: Callable[[bytes], Any], **_: Any) -> Callable[..., Any]:
        async def call(request: Any, **_: Any) -> Any:
            h = self.handler.service(_CallDetails(method))
            if h is None:
                raise NotImplementedError(f"{method}: not served")
            req = h.request_deserializer(request_serializer(request))
            context = _Context(self.peer)
            if h.unary_unary is not None:
                reply = await h.unary_unary(req, context)
            else:  # a streamed handler (the read RPCs) writes its one reply
                await h.unary_stream(req, context)
                [reply] = context.written
            out = response_deserializer(h.response_serializer(reply))
            if self.on_reply is not None:
                self.on_reply(method, out)
            return out

        return call

    async def close(self) -> None:
        return None
