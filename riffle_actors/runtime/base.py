"""Actor, ActorRef and the per-actor run loop (``_Cell``): the core of the in-process actor runtime.

This module owns how one actor lives and dies:

- **Processing.** Messages are processed strictly one at a time in FIFO order. A plain ``def receive``
  is called directly (no coroutine per message); an ``async def receive`` is awaited before the next
  message is taken. A plain ``receive`` that *returns* an awaitable means "reply later": the mailbox is
  not blocked, the ask is answered when the awaitable finishes (an IO completion, for example). Its
  failure follows the same rules as a raise from ``receive``.
- **Failures.** An exception that is an instance of ``expected_errors`` goes to the asker (or is logged
  at debug level for a tell) and the actor carries on. Any other exception goes to the asker, then the
  actor *crashes*: every other queued ask fails with ``ActorDeadError`` (queued tells are dropped and
  counted in a warning), owned tasks are cancelled, ``on_stop`` runs, and the parent supervisor decides
  whether to restart it. An exception in a task started with ``Actor.spawn`` crashes the actor too.
- **Stopping.** ``await ref.stop()`` processes nothing more, fails queued and in-flight asks with
  ``ActorDeadError`` and awaits ``on_stop``. Called from inside the actor it takes effect after the
  current message. A supervised actor's parent may still restart it (``RestartPolicy.PERMANENT``).
- **Identity.** An ``ActorRef`` and its mailbox survive restarts: the ref always points to the
  current incarnation; messages sent while a restart is pending wait for the new incarnation.
- **Death watch.** ``ref.watch(watcher)`` tells ``Terminated(ref=..., reason=...)`` to the watcher
  once the actor is stopped for good (never for a restart).

No caller is ever left waiting: every path that ends an incarnation fails the replies it owns.

Not covered: restart decisions (``supervisor.py``), the name registry and shutdown order
(``system.py``), the mailbox data structure (``mailbox.py``). See also ``timer.py``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from loguru import logger

from riffle_actors.runtime.mailbox import (
    ActorDeadError,
    Envelope,
    Mailbox,
    MailboxFullError,
    MailboxStatistics,
)

if TYPE_CHECKING:
    from riffle_actors.runtime.system import ActorSystem

T = TypeVar("T")

# A plain receive yields to the event loop after this many back-to-back messages, so one busy actor
# cannot starve the transports for more than a few milliseconds.
_YIELD_EVERY = 256

_MISSING: Any = object()

# Called by a cell when an incarnation ended (reason None = normal stop). Returns True when the parent
# will decide about a restart (the cell then waits in state "restarting"), False to stop for good.
ExitHook = Callable[["_Cell", BaseException | None], bool]


@dataclass(frozen=True, slots=True, kw_only=True)
class Terminated:
    """Told to every watcher when ``ref``'s actor stopped for good; ``reason`` is None for a normal stop."""

    ref: ActorRef
    reason: BaseException | None


class Actor:
    """Base class of every actor; subclass it and implement ``receive``.

    The runtime sets ``ref``, ``system`` and ``name`` before ``on_start`` runs, so ``__init__`` is free
    to take whatever the actor needs and does not have to call ``super().__init__()``.
    """

    mailbox_size: ClassVar[int] = 10_000
    expected_errors: ClassVar[tuple[type[BaseException], ...]] = ()

    ref: ActorRef
    system: ActorSystem
    name: str
    _cell: _Cell

    def receive(self, msg: Any) -> Any:
        """Handle one message; the return value answers an ask. See the module docstring."""
        raise NotImplementedError(f"{type(self).__name__} must implement receive()")

    async def on_start(self) -> None:
        """Runs before the first message of every incarnation; raising fails the start."""

    async def on_stop(self) -> None:
        """Runs after the last message of every incarnation (normal stop, crash, before a restart)."""

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coro`` as a task owned by this incarnation: cancelled when it ends, crashes it on error."""
        cell: _Cell | None = getattr(self, "_cell", None)
        if cell is None or cell.actor is not self or cell.state not in ("starting", "running"):
            coro.close()
            raise ActorDeadError(f"actor {getattr(self, 'name', type(self).__name__)!r} is not running")
        task = cell.loop.create_task(coro, name=f"actor:{cell.name}:spawned")
        cell.owned[task] = None
        task.add_done_callback(partial(cell.spawned_done, self))
        return task

    def stop_self(self) -> None:
        """Stop after the current message; for a plain ``receive``, which cannot ``await ref.stop()``."""
        self._cell.request_stop()

    async def _stop_children(self) -> None:
        """Runtime hook run before ``on_stop``; ``Supervisor`` stops its children here."""


class ActorRef:
    """Stable handle to an actor; survives restarts. Compare and hash by identity."""

    __slots__ = ("name", "_cell", "_mailbox")

    def __init__(self, cell: _Cell) -> None:
        self.name = cell.name
        self._cell = cell
        self._mailbox = cell.mailbox

    def __repr__(self) -> str:
        return f"<ActorRef {self.name!r} {self._cell.state}>"

    @property
    def is_alive(self) -> bool:
        """True while the actor runs, starts or waits for a restart."""
        return self._cell.state in ("starting", "running", "restarting")

    def tell_nowait(self, msg: Any) -> None:
        """Enqueue ``msg``; raise ``MailboxFullError`` at capacity, ``ActorDeadError`` if stopped."""
        self._mailbox.put_nowait((msg, None))

    async def tell(self, msg: Any) -> None:
        """Enqueue ``msg``, waiting only while the mailbox is full; ``ActorDeadError`` if stopped."""
        try:
            self._mailbox.put_nowait((msg, None))
        except MailboxFullError:
            await self._mailbox.put((msg, None))

    async def ask(self, msg: Any, timeout: float | None = None) -> Any:
        """Send ``msg`` and return what ``receive`` returned (or raise what it raised).

        Raises ``TimeoutError`` after ``timeout`` seconds (waiting for mailbox space included) and
        ``ActorDeadError`` if the actor is stopped, or stops or crashes before replying.
        """
        mb = self._mailbox
        reply: asyncio.Future[Any] = self._cell.loop.create_future()
        if timeout is None:
            try:
                mb.put_nowait((msg, reply))
            except MailboxFullError:
                await mb.put((msg, reply))
            return await reply
        async with asyncio.timeout(timeout):
            await mb.put((msg, reply))
            return await reply

    def tell_threadsafe(self, msg: Any) -> None:
        """Tell from another thread (for example an executor completing IO).

        The capacity is not enforced because a foreign thread cannot wait on the loop: bound the
        producer instead. A message for a stopped actor is dropped with a warning.
        """
        self._cell.loop.call_soon_threadsafe(self._tell_control_or_warn, msg)

    def statistics(self) -> MailboxStatistics:
        """Current mailbox depth, counters and lifecycle state."""
        cell = self._cell
        return MailboxStatistics(
            name=self.name,
            depth=len(self._mailbox.queue),
            capacity=self._mailbox.capacity,
            processed=cell.processed,
            restarts=cell.restarts,
            state=cell.state,
        )

    async def stop(self) -> None:
        """Stop gracefully; returns once ``on_stop`` ran. See the module docstring."""
        await self._cell.stop()

    def crash(self, reason: BaseException) -> None:
        """Crash the running incarnation as if ``receive`` had raised ``reason`` (a kill).

        For fault injection and operator tooling: in-flight and queued asks fail with
        ``ActorDeadError``, owned tasks are cancelled, and the parent supervisor applies its
        restart policy. No-op when the actor is not running.
        """
        self._cell.request_crash(reason)

    def watch(self, watcher: ActorRef) -> None:
        """Tell ``Terminated`` to ``watcher`` when this actor stops for good (at once if it already has)."""
        cell = self._cell
        if cell.state == "stopped":
            watcher._tell_control_or_warn(Terminated(ref=self, reason=cell.reason))
        elif watcher not in cell.watchers:
            cell.watchers.append(watcher)

    def unwatch(self, watcher: ActorRef) -> None:
        """Undo ``watch``."""
        try:
            self._cell.watchers.remove(watcher)
        except ValueError:
            pass

    def _tell_control(self, msg: Any) -> None:
        """Runtime-internal tell that ignores the capacity (bounded control traffic only)."""
        self._mailbox.put_control((msg, None))

    def _tell_control_or_warn(self, msg: Any) -> None:
        try:
            self._mailbox.put_control((msg, None))
        except ActorDeadError:
            logger.warning("dropped {} for stopped actor {!r}", type(msg).__name__, self.name)


_AWAITABLE_TYPES: dict[type, bool] = {}  # per-type answer: one dict lookup per ask reply


def _is_awaitable(value: Any) -> bool:
    cls = type(value)
    known = _AWAITABLE_TYPES.get(cls)
    if known is None:
        known = _AWAITABLE_TYPES[cls] = inspect.isawaitable(value)
    return known


class _Cell:
    """Runtime state of one actor across its incarnations; owned by its ``ActorRef``.

    States: ``starting`` → ``running`` → ``stopping`` → (``restarting`` → ``starting`` …) → ``stopped``.
    """

    def __init__(self, system: ActorSystem, name: str, capacity: int) -> None:
        self.system = system
        self.name = name
        self.loop = asyncio.get_running_loop()
        self.mailbox = Mailbox(name, capacity, self.loop)
        self.ref = ActorRef(self)
        self.actor: Actor | None = None
        self.state = "starting"
        self.restarts = 0
        self.processed = 0
        self.reason: BaseException | None = None  # why it stopped for good
        self.hook: ExitHook | None = None  # the parent's decision; None = unsupervised
        self.final = False  # stop for good: do not consult the parent
        self.watchers: list[ActorRef] = []
        # Awaitables owned by the current incarnation -> the ask reply they answer (None for spawn()).
        self.owned: dict[asyncio.Future[Any], asyncio.Future[Any] | None] = {}
        self._task: asyncio.Task[None] | None = None
        self._stop_requested = False
        self._crash: BaseException | None = None

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self, actor: Actor) -> None:
        """Start the first incarnation; returns after ``on_start`` (re-raising its failure)."""
        started: asyncio.Future[None] = self.loop.create_future()
        self._launch(actor, started)
        await started

    def restart(self, actor: Actor) -> None:
        """Start a new incarnation after a crash or stop; failures come back through the hook."""
        if self.state != "restarting":
            raise RuntimeError(f"cannot restart actor {self.name!r} in state {self.state}")
        self.restarts += 1
        self._launch(actor, None)

    def _launch(self, actor: Actor, started: asyncio.Future[None] | None) -> None:
        actor._cell = self
        actor.ref = self.ref
        actor.system = self.system
        actor.name = self.name
        self.actor = actor
        self.state = "starting"
        self._stop_requested = False
        self._crash = None
        self._task = self.loop.create_task(self._run(actor, started), name=f"actor:{self.name}")

    async def stop(self, *, final: bool = False) -> None:
        """Stop the current incarnation (``final``: and never restart it); wait until it ended."""
        if final:
            self.final = True
        state = self.state
        if state == "stopped":
            return
        if state == "restarting":  # no incarnation runs: nothing to wait for
            self.terminate(self.reason)
            return
        task = self._task
        self.request_stop()
        if task is not None and task is not asyncio.current_task():
            await asyncio.wait([task])  # not ``await task``: our caller's cancellation must not hit it

    def request_stop(self) -> None:
        """Ask the running incarnation to end: after the current message if called from inside it."""
        if self.state not in ("starting", "running") or self._stop_requested:
            return
        self._stop_requested = True
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # interrupts the idle wait (or an async receive / on_start in progress)

    def request_crash(self, exc: BaseException) -> None:
        """Crash the running incarnation from outside its run loop (owned task or reply-later failure)."""
        if self.state not in ("starting", "running") or self._crash is not None or self._stop_requested:
            logger.opt(exception=exc).debug("actor {!r}: late failure ignored", self.name)
            return
        self._crash = exc
        assert self._task is not None
        self._task.cancel()

    def terminate(self, reason: BaseException | None) -> None:
        """Stop for good: close the mailbox, fail what is queued, unregister, notify watchers."""
        if self.state == "stopped":
            return
        self.state = "stopped"
        self.reason = reason
        self.actor = None
        self._fail_envelopes(self.mailbox.close(), reason)
        self.system._unregister(self.ref)
        watchers, self.watchers = self.watchers, []
        for watcher in watchers:
            if watcher.is_alive:  # a watcher that is gone itself no longer cares
                watcher._tell_control_or_warn(Terminated(ref=self.ref, reason=reason))

    # ---- run loop ----------------------------------------------------------------------------

    async def _run(self, actor: Actor, started: asyncio.Future[None] | None) -> None:
        reason: BaseException | None = None
        ran = False
        try:
            await actor.on_start()
            ran = True
            self.state = "running"
            if started is not None and not started.done():
                started.set_result(None)
            if inspect.iscoroutinefunction(actor.receive):
                reason = await self._loop_async(actor)
            else:
                reason = await self._loop_sync(actor)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            assert task is not None
            if task.cancelling():
                while task.cancelling():
                    task.uncancel()
                reason = self._crash
                if reason is None and not self._stop_requested:
                    self.final = True  # cancelled by someone else (loop shutdown): stop for good
            else:
                reason = exc  # receive or on_start raised CancelledError on its own: a failure
        except Exception as exc:  # on_start failed (the loops return failures instead of raising)
            reason = exc
        if started is not None and not ran:
            self.final = True  # a failed first start is reported to the starter, never restarted
            if not started.done():
                started.set_exception(reason or ActorDeadError(f"actor {self.name!r} stopped while starting"))
        await self._finish(actor, reason, ran)

    async def _loop_sync(self, actor: Actor) -> BaseException | None:
        mb = self.mailbox
        q = mb.queue
        putters = mb.putters
        receive = actor.receive
        expected = actor.expected_errors
        done = 0
        burst = 0
        try:
            while True:
                if self._stop_requested:
                    return None
                if not q:
                    self.processed += done
                    done = burst = 0
                    await mb.wait_nonempty()
                    continue
                msg, reply = q.popleft()
                if putters:
                    mb.release_one()
                done += 1
                try:
                    result = receive(msg)
                except Exception as exc:
                    if self._receive_failed(exc, msg, reply, expected):
                        continue
                    return exc
                if result is not None and _is_awaitable(result):
                    self._reply_later(actor, result, reply)
                elif reply is not None and not reply.done():
                    reply.set_result(result)
                burst += 1
                if burst >= _YIELD_EVERY:
                    self.processed += done
                    done = burst = 0
                    await asyncio.sleep(0)
        finally:
            self.processed += done

    def _receive_failed(self, exc: Exception, msg: Any, reply: asyncio.Future[Any] | None,
                        expected: tuple[type[BaseException], ...]) -> bool:
        """Hand a failure of ``receive`` to the asker; True when the actor carries on (an expected error)."""
        if reply is not None and not reply.done():
            reply.set_exception(exc)
        if isinstance(exc, expected):
            if reply is None:
                logger.debug("actor {!r}: {!r} on tell {}", self.name, exc, type(msg).__name__)
            return True
        return False

    async def _loop_async(self, actor: Actor) -> BaseException | None:
        mb = self.mailbox
        q = mb.queue
        receive = actor.receive
        expected = actor.expected_errors
        burst = 0
        while True:
            if self._stop_requested:
                return None
            if not q:
                burst = 0
                await mb.wait_nonempty()
                continue
            burst += 1
            if burst >= _YIELD_EVERY:  # a receive that never suspends must not starve the loop
                burst = 0
                await asyncio.sleep(0)
                continue
            msg, reply = q.popleft()
            if mb.putters:
                mb.release_one()
            self.processed += 1
            try:
                result = await receive(msg)
            except asyncio.CancelledError:
                if reply is not None and not reply.done():
                    reply.set_exception(ActorDeadError(f"actor {self.name!r} stopped while processing"))
                raise
            except Exception as exc:
                if self._receive_failed(exc, msg, reply, expected):
                    continue
                return exc
            if reply is not None and not reply.done():
                reply.set_result(result)

    async def _finish(self, actor: Actor, reason: BaseException | None, ran: bool) -> None:
        """End one incarnation: fail what it owes, clean up, then stop for good or ask the parent."""
        self.state = "stopping"
        if reason is not None:
            logger.opt(exception=reason).error("actor {!r} crashed: {!r}", self.name, reason)
        if self.final or self.hook is None:
            self._fail_envelopes(self.mailbox.close(), reason)
        else:  # a restart may follow: keep accepting, but nothing queued now belongs to the next life
            self._fail_envelopes(self.mailbox.drain(), reason)
        owned, self.owned = self.owned, {}
        for fut, reply in owned.items():
            if reply is not None and not reply.done():
                reply.set_exception(self._dead_error(reason))
            fut.cancel()
        if owned:
            await asyncio.gather(*owned, return_exceptions=True)
        try:
            await actor._stop_children()
        except Exception:
            logger.exception("actor {!r}: stopping its children failed", self.name)
        if ran:
            try:
                await actor.on_stop()
            except Exception:
                logger.exception("actor {!r}: on_stop failed", self.name)
        self._task = None
        self.actor = None
        if self.final or self.hook is None or not self.hook(self, reason):
            self.terminate(reason)
        else:
            self.state = "restarting"
            self.reason = reason

    # ---- helpers -----------------------------------------------------------------------------

    def _reply_later(self, actor: Actor, result: Awaitable[Any], reply: asyncio.Future[Any] | None) -> None:
        if inspect.iscoroutine(result):
            fut: asyncio.Future[Any] = self.loop.create_task(result, name=f"actor:{self.name}:reply")
        else:
            fut = asyncio.ensure_future(result)
        self.owned[fut] = reply
        fut.add_done_callback(partial(self._reply_done, actor, reply))

    def _reply_done(self, actor: Actor, reply: asyncio.Future[Any] | None, fut: asyncio.Future[Any]) -> None:
        if self.owned.pop(fut, _MISSING) is _MISSING or self.actor is not actor:
            return  # the incarnation already ended and failed the reply
        if fut.cancelled():
            if reply is not None:
                reply.cancel()
            return
        exc = fut.exception()
        if exc is None:
            if reply is not None and not reply.done():
                reply.set_result(fut.result())
            return
        if reply is not None and not reply.done():
            reply.set_exception(exc)
        if not isinstance(exc, actor.expected_errors):
            self.request_crash(exc)
        elif reply is None:
            logger.debug("actor {!r}: {!r} in a reply-later tell", self.name, exc)

    def spawned_done(self, actor: Actor, task: asyncio.Task[Any]) -> None:
        if self.owned.pop(task, _MISSING) is _MISSING or self.actor is not actor or task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.request_crash(exc)

    def _dead_error(self, reason: BaseException | None) -> ActorDeadError:
        how = "crashed" if reason is not None else "stopped"
        err = ActorDeadError(f"actor {self.name!r} {how} before replying")
        err.__cause__ = reason
        return err

    def _fail_envelopes(self, envelopes: list[Envelope], reason: BaseException | None) -> None:
        if not envelopes:
            return
        told = 0
        for _, reply in envelopes:
            if reply is None:
                told += 1
            elif not reply.done():
                reply.set_exception(self._dead_error(reason))
        if told:
            log = logger.warning if reason is not None else logger.info
            log("actor {!r}: dropped {} queued tell(s) on {}", self.name, told,
                "crash" if reason is not None else "stop")
