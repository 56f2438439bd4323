"""ActorCell and ActorRef: how one actor is scheduled, processes its mail, and lives and dies.

This module owns the runtime state of one actor across its incarnations (the *cell*) and the stable
handle senders hold (``ActorRef``):

- **Scheduling: idle actors cost no task.** An actor runs only while it has mail. A put into the
  mailbox of an idle actor schedules it: a plain ``def receive`` runs in a loop callback
  (``loop.call_soon``), an ``async def receive`` in a task. It processes until the mailbox is empty, and
  then nothing of it is left on the loop: no task, no handle, no future; the mailbox only remembers to
  schedule it again on the next put (``Mailbox.notify_next_put``). A task exists only while the actor
  starts (``on_start``), processes with an async ``receive``, or ends (``on_stop``). Every callback and
  task of one incarnation runs in one ``contextvars.Context``, copied when the incarnation started.
- **Processing.** Messages are processed strictly one at a time in FIFO order. A plain ``receive`` is
  called directly (no coroutine per message), and after ``YIELD_EVERY`` back-to-back messages the actor
  gives the loop a turn before it goes on. An async ``receive`` is awaited before the next message is
  taken. A plain ``receive`` that *returns* an awaitable means "reply later": the mailbox is not blocked,
  the ask is answered when the awaitable finishes (an IO completion, for example). Its failure follows
  the same rules as a raise from ``receive``. A ``receive`` that returns ``Forward(ref, msg)`` hands the
  message's reply on to another actor: ``msg`` goes to ``ref``'s mailbox, and that actor answers the ask.
- **Failures.** An exception that is an instance of ``expected_errors`` goes to the asker (or is logged
  at debug level for a tell) and the actor carries on. Any other exception goes to the asker, then the
  actor *crashes*: owned tasks are cancelled and the asks they would have answered fail with
  ``ActorDeadError``, ``on_stop`` runs, and the exit hook (the parent supervisor) decides whether it
  restarts. An exception in a task owned by the incarnation crashes it too, whether the actor is busy
  or idle at the time.
- **The mailbox outlives the incarnation.** While a restart may follow (a supervised actor not stopped
  for good), what is queued stays queued: the next incarnation processes the tells and answers the
  asks, in order. When no restart follows (an unsupervised actor, a ``TEMPORARY`` child, a supervisor
  giving up, a stop for good) the mailbox is closed and every queued ask fails with ``ActorDeadError``
  (queued tells are dropped and counted in a warning). So an ask is never left waiting: it is answered
  by the incarnation that took it, failed when that one ends before replying, or left for the next.
- **Crash injection (tests).** ``ActorSystem.inject_crash(name, after=n)`` makes the incarnation raise
  ``InjectedCrash`` in place of the (n+1)-th message it handles from then on (a later incarnation if
  none runs now): an ask gets the error, a tell goes back to the head of the mailbox for the next
  incarnation, so the crash falls *between* two messages and only the incarnation's own state is lost.
  It wraps ``receive`` on the instance while armed: the hot path pays nothing.
- **Stopping.** ``await ref.stop()`` processes nothing more, fails queued and in-flight asks with
  ``ActorDeadError`` and awaits ``on_stop``. From inside the actor it takes effect after the current
  message. A supervised actor's parent may still restart it (``RestartPolicy.PERMANENT``).
- **Identity.** An ``ActorRef`` and its mailbox survive restarts: the ref always points to the
  current incarnation; messages sent while a restart is pending wait for the new incarnation.
- **Death watch.** ``ref.watch(watcher)`` tells ``Terminated(ref=..., reason=...)`` to the watcher
  once the actor is stopped for good (never for a restart).

No caller is ever left waiting: every path that ends an incarnation fails the replies it owns.

``InjectedCrash`` is exported by the package; runtime-internal names (used by the other runtime modules,
not exported by the package): ``ActorCell``,
``ExitHook``, ``Incarnation``, ``cell_of(ref)`` and ``tell_control(ref, msg)``.

Not covered: the ``Actor`` base class (``base.py``), restart decisions (``supervisor.py``), the name
registry and shutdown order (``system.py``), the mailbox data structure (``mailbox.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Protocol, TypeVar

from loguru import logger

from riffle_actors.runtime.mailbox import (
    ActorDeadError,
    Envelope,
    Mailbox,
    MailboxFullError,
    MailboxStatistics,
)

T = TypeVar("T")

YIELD_EVERY = 256
"""A busy actor gives the event loop a turn after this many back-to-back messages, so one busy actor
cannot starve the transports for more than a few milliseconds."""

_MISSING: Any = object()

# Called by a cell when an incarnation ended (reason None = normal stop). Returns True when the parent
# will decide about a restart (the cell then waits in state "restarting"), False to stop for good.
ExitHook = Callable[["ActorCell", BaseException | None], bool]


class Incarnation(Protocol):
    """What a cell needs of the actor object it runs (``base.Actor`` is the implementation).

    The cell sets ``ref``, ``system`` and ``name`` before ``on_start``; ``system`` is whatever the cell
    was given as its host, the cell never uses it.
    """

    ref: ActorRef
    system: Any
    name: str
    expected_errors: ClassVar[tuple[type[BaseException], ...]]

    def receive(self, msg: Any) -> Any: ...

    async def on_start(self) -> None: ...

    async def on_stop(self) -> None: ...

    async def stop_children(self) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Terminated:
    """Told to every watcher when ``ref``'s actor stopped for good; ``reason`` is None for a normal stop."""

    ref: ActorRef
    reason: BaseException | None


class ActorRef:
    """Stable handle to an actor; survives restarts. Compare and hash by identity."""

    __slots__ = ("name", "_cell", "_mailbox")

    def __init__(self, cell: ActorCell) -> None:
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
        try:
            if timeout is None:
                try:
                    mb.put_nowait((msg, reply))
                except MailboxFullError:
                    await mb.put((msg, reply))
                return await reply
            async with asyncio.timeout(timeout):
                await mb.put((msg, reply))
                return await reply
        finally:
            # an error raised here keeps this frame in its traceback: without these references it would
            # form a cycle (error -> frame -> reply -> error) holding the message, e.g. a whole request,
            # until the cyclic garbage collector happens to run
            del reply, msg

    def ask_nowait(self, msg: Any) -> asyncio.Future[Any]:
        """Send ``msg`` as an ask and return its reply future, without waiting: ``MailboxFullError`` at
        capacity, ``ActorDeadError`` if stopped. The future gets what ``ask`` would return or raise; the
        caller must not cancel it while the actor may still answer (an ``asyncio.shield`` keeps it)."""
        reply: asyncio.Future[Any] = self._cell.loop.create_future()
        self._mailbox.put_nowait((msg, reply))
        return reply

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
            depth=len(self._mailbox),
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
        elif cell.watchers is None:
            cell.watchers = [watcher]
        elif watcher not in cell.watchers:
            cell.watchers.append(watcher)

    def unwatch(self, watcher: ActorRef) -> None:
        """Undo ``watch``."""
        watchers = self._cell.watchers
        if watchers is not None and watcher in watchers:
            watchers.remove(watcher)

    def _tell_control_or_warn(self, msg: Any) -> None:
        try:
            self._mailbox.put_control((msg, None))
        except ActorDeadError:
            logger.warning("dropped {} for stopped actor {!r}", type(msg).__name__, self.name)


def cell_of(ref: ActorRef) -> ActorCell:
    """The cell behind ``ref`` (runtime-internal: supervisors and the system manage actors through it)."""
    return ref._cell


def tell_control(ref: ActorRef, msg: Any) -> None:
    """Tell ``msg`` ignoring the capacity (bounded runtime control traffic only); raise if stopped."""
    ref._mailbox.put_control((msg, None))


class Forward:
    """Returned by ``receive``: hand this message on to ``ref`` as ``msg``, with its reply (an ask stays an
    ask, answered by ``ref``'s actor; a tell stays a tell).

    For one step of a request that another actor finishes: the asker is answered by the second actor
    directly, with every outcome of an ask of it (its result, its error, ``ActorDeadError`` if it stops
    first) and no future, callback or wake-up of the first actor in between; a failure there is the
    asker's, never the first actor's. A full or stopped mailbox of ``ref`` fails the reply at once
    (``MailboxFullError`` / ``ActorDeadError``).
    """

    __slots__ = ("msg", "ref")

    def __init__(self, ref: ActorRef, msg: Any) -> None:
        self.ref = ref
        self.msg = msg

    def send(self, reply: asyncio.Future[Any] | None) -> None:
        try:
            self.ref._mailbox.put_nowait((self.msg, reply))
        except (MailboxFullError, ActorDeadError) as exc:
            if reply is not None and not reply.done():
                reply.set_exception(exc)


# per-type answer: one dict lookup per ask reply; a Forward takes the awaitable branch, which tells it apart
_AWAITABLE_TYPES: dict[type, bool] = {Forward: True}


def _is_awaitable(value: Any) -> bool:
    cls = type(value)
    known = _AWAITABLE_TYPES.get(cls)
    if known is None:
        known = _AWAITABLE_TYPES[cls] = inspect.isawaitable(value)
    return known


class InjectedCrash(Exception):
    """Raised in place of a message by ``ActorSystem.inject_crash`` (tests and simulations only)."""


class _CrashInjection:
    """One armed test crash of a cell: counts the messages its incarnation handles, then raises."""

    __slots__ = ("actor", "cell", "error", "left", "receive")

    def __init__(self, cell: ActorCell, after: int, error: BaseException | None) -> None:
        self.cell = cell
        self.left = after
        self.error = error
        self.actor: Incarnation | None = None
        self.receive: Callable[[Any], Any] | None = None

    def arm(self, actor: Incarnation) -> None:
        """Wrap ``actor.receive`` on the instance (the class's method is left alone)."""
        if self.actor is actor:
            return
        self.disarm()
        receive = actor.receive
        self.actor, self.receive = actor, receive
        if inspect.iscoroutinefunction(receive):
            async def wrapped_async(msg: Any) -> Any:
                self._count()
                return await receive(msg)
            actor.receive = wrapped_async  # type: ignore[method-assign]
        else:
            def wrapped(msg: Any) -> Any:
                self._count()
                return receive(msg)
            actor.receive = wrapped  # type: ignore[method-assign]

    def disarm(self) -> None:
        actor, self.actor = self.actor, None
        if actor is not None and "receive" in vars(actor):
            del actor.receive

    def _count(self) -> None:
        if self.left > 0:
            self.left -= 1
            return
        self.disarm()
        if self.cell._inject is self:
            self.cell._inject = None
        err = InjectedCrash(f"injected crash of actor {self.cell.name!r}")
        if self.error is not None:
            err.__cause__ = self.error
        raise err


class ActorCell:
    """Runtime state of one actor across its incarnations; owned by its ``ActorRef``.

    States: ``starting`` → ``running`` → ``stopping`` → (``restarting`` → ``starting`` …) → ``stopped``.
    While ``running`` the cell is in exactly one of these scheduling modes: *idle* (the mailbox will
    call ``_wake`` on the next put), *scheduled* (``_handle``: a drain callback is queued on the loop),
    *draining* (that callback is running), or *in a task* (``_task``: an async receive is processing).
    ``host`` is only handed to each incarnation as its ``system``; ``on_terminated`` is called once,
    when the actor stops for good (the system unregisters its name there).
    """

    __slots__ = (
        "host", "name", "loop", "mailbox", "ref", "actor", "state", "restarts", "processed", "reason",
        "hook", "final", "watchers", "owned", "_on_terminated", "_task", "_handle", "_draining",
        "_async", "_context", "_stop_requested", "_crash", "_halting", "_task_began", "_inject",
    )

    def __init__(self, host: Any, name: str, capacity: int,
                 on_terminated: Callable[[ActorRef], None] | None = None) -> None:
        self.host = host
        self.name = name
        self.loop = asyncio.get_running_loop()
        self.mailbox = Mailbox(name, capacity, self.loop, self._wake)
        self.ref = ActorRef(self)
        self.actor: Incarnation | None = None
        self.state = "starting"
        self.restarts = 0
        self.processed = 0
        self.reason: BaseException | None = None  # why it stopped for good
        self.hook: ExitHook | None = None  # the parent's decision; None = unsupervised
        self.final = False  # stop for good: do not consult the parent
        # Made on first use, like the mailbox's deques: an idle actor that never needed them holds none.
        self.watchers: list[ActorRef] | None = None
        # Awaitables owned by the current incarnation -> the ask reply they answer (None for spawn()).
        self.owned: dict[asyncio.Future[Any], asyncio.Future[Any] | None] | None = None
        self._on_terminated = on_terminated
        self._task: asyncio.Task[None] | None = None  # on_start, an async drain, or the end of a life
        self._task_began = False  # _task has run its first step (cancelling it before would skip its try)
        self._handle: asyncio.Handle | None = None  # a queued drain of a plain receive
        self._draining = False  # a plain receive's drain is on the stack right now
        self._async = False  # the current incarnation's receive is a coroutine function
        self._context: contextvars.Context | None = None  # every callback and task of the incarnation
        self._stop_requested = False
        self._crash: BaseException | None = None
        self._halting = False  # _stop_requested or _crash: one test per message on the hot path
        self._inject: _CrashInjection | None = None  # a test crash armed for a later incarnation

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self, actor: Incarnation) -> None:
        """Start the first incarnation; returns after ``on_start`` (re-raising its failure)."""
        started: asyncio.Future[None] = self.loop.create_future()
        self._launch(actor, started)
        await started

    def restart(self, actor: Incarnation) -> None:
        """Start a new incarnation after a crash or stop; failures come back through the hook."""
        if self.state != "restarting":
            raise RuntimeError(f"cannot restart actor {self.name!r} in state {self.state}")
        self.restarts += 1
        self._launch(actor, None)

    def spawn_owned(self, actor: Incarnation, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coro`` as a task owned by ``actor``'s incarnation (see ``Actor.spawn``)."""
        if self.actor is not actor or self.state not in ("starting", "running"):
            coro.close()
            raise ActorDeadError(f"actor {getattr(actor, 'name', type(actor).__name__)!r} is not running")
        task = self.loop.create_task(coro, name=f"actor:{self.name}:spawned")
        self._own(task, None)
        task.add_done_callback(partial(self._spawned_done, actor))
        return task

    def _launch(self, actor: Incarnation, started: asyncio.Future[None] | None) -> None:
        actor.ref = self.ref
        actor.system = self.host
        actor.name = self.name
        self.actor = actor
        self.state = "starting"
        self._stop_requested = False
        self._crash = None
        self._halting = False
        if self._inject is not None:
            self._inject.arm(actor)
        self._async = inspect.iscoroutinefunction(actor.receive)
        self._context = context = contextvars.copy_context()
        self._task_began = False
        self._task = self.loop.create_task(self._start(actor, started), name=f"actor:{self.name}",
                                           context=context)

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
        self.request_stop()
        task = self._task  # the task that ends the incarnation (request_stop made one if it was idle)
        if task is not None and task is not asyncio.current_task():
            await asyncio.wait([task])  # not ``await task``: our caller's cancellation must not hit it

    def request_stop(self) -> None:
        """Ask the running incarnation to end: after the current message if called from inside it."""
        if self.state not in ("starting", "running") or self._stop_requested:
            return
        self._stop_requested = self._halting = True
        self._interrupt(cancel_current=False)

    def request_crash(self, exc: BaseException) -> None:
        """Crash the running incarnation from outside its receive (owned task or reply-later failure)."""
        if self.state not in ("starting", "running") or self._crash is not None or self._stop_requested:
            logger.opt(exception=exc).debug("actor {!r}: late failure ignored", self.name)
            return
        self._crash = exc
        self._halting = True
        self._interrupt(cancel_current=True)

    def inject_crash(self, after: int, error: BaseException | None) -> None:
        """Test seam: the message handled after the next ``after`` ones raises ``InjectedCrash``.

        The crash takes the place of that message: a tell is put back at the head of the mailbox for
        the next incarnation, an ask is answered with the error. Costs nothing until armed: it wraps
        the incarnation's ``receive`` (so a restarted incarnation is armed in ``_launch``), and the
        wrapper removes itself when it fires or when a new injection replaces it.
        """
        if after < 0:
            raise ValueError(f"after must be >= 0, got {after}")
        if self.state == "stopped":
            raise ActorDeadError(f"actor {self.name!r} is stopped")
        if self._inject is not None:
            self._inject.disarm()
        self._inject = injection = _CrashInjection(self, after, error)
        actor = self.actor
        if actor is not None and self.state in ("starting", "running"):
            injection.arm(actor)

    def _interrupt(self, *, cancel_current: bool) -> None:
        """Make the incarnation act on ``_stop_requested`` / ``_crash`` in whatever mode it is in."""
        task = self._task
        if task is not None:  # starting or an async receive: interrupt its await
            # A task that has not begun looks at the flags when it does; cancelling it now would end it
            # before its first line, skipping the end of the incarnation.
            if self._task_began and (cancel_current or task is not asyncio.current_task()):
                task.cancel()
            return
        if self._draining:  # the drain looks at the flags after the current message
            return
        handle = self._handle  # scheduled or idle: end it now
        if handle is not None:
            handle.cancel()
            self._handle = None
        actor = self.actor
        assert actor is not None
        self._end(actor, self._crash, ran=True)

    def terminate(self, reason: BaseException | None) -> None:
        """Stop for good: close the mailbox, fail what is queued, unregister, notify watchers."""
        if self.state == "stopped":
            return
        self.state = "stopped"
        self.reason = reason
        self.actor = None
        self._context = None
        self._fail_envelopes(self.mailbox.close(), reason)
        if self._on_terminated is not None:
            self._on_terminated(self.ref)
        watchers, self.watchers = self.watchers or (), None
        for watcher in watchers:
            if watcher.is_alive:  # a watcher that is gone itself no longer cares
                watcher._tell_control_or_warn(Terminated(ref=self.ref, reason=reason))

    # ---- scheduling --------------------------------------------------------------------------

    def _wake(self) -> None:
        """Mail arrived for an idle actor (the mailbox's ``on_put``): schedule it."""
        if self._async:
            actor = self.actor
            assert actor is not None
            self._task_began = False
            self._task = self.loop.create_task(self._drain_async(actor), name=f"actor:{self.name}",
                                               context=self._context)
        else:
            self._handle = self.loop.call_soon(self._drain_sync, context=self._context)

    def _idle_or_reschedule(self) -> None:
        """A plain receive's incarnation has started: schedule a drain if mail is waiting, else go idle."""
        if self.mailbox.queue:
            self._wake()
        else:
            self.mailbox.notify_next_put()

    async def _start(self, actor: Incarnation, started: asyncio.Future[None] | None) -> None:
        self._task_began = True
        reason: BaseException | None
        if self._halting:  # stopped or crashed before on_start could begin
            reason = self._crash
        else:
            try:
                await actor.on_start()
            except asyncio.CancelledError as exc:
                reason = self._cancelled(exc)
            except Exception as exc:
                reason = exc
            else:
                await self._started(actor, started)
                return
        if started is not None:
            self.final = True  # a failed first start is reported to the starter, never restarted
            if not started.done():
                started.set_exception(reason or ActorDeadError(f"actor {self.name!r} stopped while starting"))
        owned = self._fail_queued(reason)
        await self._finish(actor, reason, ran=False, owned=owned)

    async def _started(self, actor: Incarnation, started: asyncio.Future[None] | None) -> None:
        """``on_start`` succeeded: report it, then process mail (async receive) or go idle."""
        self.state = "running"
        if started is not None and not started.done():
            started.set_result(None)
        if self._halting:  # on_start swallowed the interruption
            owned = self._fail_queued(self._crash)
            await self._finish(actor, self._crash, ran=True, owned=owned)
        elif self._async:
            await self._drain_async(actor)
        else:
            self._task = None
            self._idle_or_reschedule()

    def _cancelled(self, exc: asyncio.CancelledError) -> BaseException | None:
        """The reason an incarnation ends when its task got ``exc``."""
        task = asyncio.current_task()
        assert task is not None
        if not task.cancelling():
            return exc  # receive or on_start raised CancelledError on its own: a failure
        while task.cancelling():
            task.uncancel()
        if self._crash is None and not self._stop_requested:
            self.final = True  # cancelled by someone else (loop shutdown): stop for good
        return self._crash

    def _drain_sync(self) -> None:
        """Process the mail of a plain ``receive`` (a loop callback); see the module docstring."""
        self._handle = None
        actor = self.actor
        assert actor is not None
        mb = self.mailbox
        q = mb.queue
        receive = actor.receive
        expected = actor.expected_errors
        reason: BaseException | None = None
        yield_every = YIELD_EVERY
        done = 0
        self._draining = True
        try:
            while q and not self._halting:
                if done >= yield_every:  # give the loop a turn, then go on
                    self._handle = self.loop.call_soon(self._drain_sync, context=self._context)
                    return
                msg, reply = q.popleft()
                if mb.putters:
                    mb.release_one()
                done += 1
                try:
                    result = receive(msg)
                except Exception as exc:
                    if self._receive_failed(exc, msg, reply, expected):
                        continue
                    reason = exc
                    break
                except BaseException as exc:  # CancelledError raised by receive itself, exit requests
                    self._receive_failed(exc, msg, reply, ())
                    self._draining = False
                    self._end(actor, exc, ran=True)
                    if isinstance(exc, asyncio.CancelledError):
                        return
                    raise
                if result is not None and _is_awaitable(result):
                    if type(result) is Forward:
                        result.send(reply)
                    else:
                        self._reply_later(actor, result, reply)
                elif reply is not None and not reply.done():
                    reply.set_result(result)
        finally:
            self._draining = False
            self.processed += done
        if reason is not None or self._halting:
            self._end(actor, reason if reason is not None else self._crash, ran=True)
        else:
            self.mailbox.notify_next_put()  # the queue is empty: idle until the next put

    async def _drain_async(self, actor: Incarnation) -> None:
        """Process the mail of an async ``receive`` (in ``_task``); see the module docstring."""
        self._task_began = True
        if self._halting:  # stopped or crashed while this task waited for its first step
            reason = self._crash
        else:
            try:
                reason = await self._process_async(actor)
            except asyncio.CancelledError as exc:
                reason = self._cancelled(exc)
            else:
                if reason is _MISSING:  # the mailbox is empty: idle until the next put
                    self._task = None
                    self.mailbox.notify_next_put()
                    return
        owned = self._fail_queued(reason)
        await self._finish(actor, reason, ran=True, owned=owned)

    async def _process_async(self, actor: Incarnation) -> Any:
        """Await ``receive`` per message until the mailbox is empty (``_MISSING``) or the life ends."""
        mb = self.mailbox
        q = mb.queue
        receive = actor.receive
        expected = actor.expected_errors
        burst = 0
        while True:
            if self._stop_requested:
                return None
            if not q:
                return _MISSING
            burst += 1
            if burst >= YIELD_EVERY:  # a receive that never suspends must not starve the loop
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
            if type(result) is Forward:
                result.send(reply)
            elif reply is not None and not reply.done():
                reply.set_result(result)

    def _receive_failed(self, exc: BaseException, msg: Any, reply: asyncio.Future[Any] | None,
                        expected: tuple[type[BaseException], ...]) -> bool:
        """Hand a failure of ``receive`` to the asker; True when the actor carries on (an expected error)."""
        if type(exc) is InjectedCrash and reply is None:
            # a test crash in place of a tell: the tell was never handled, the next incarnation gets it
            self.mailbox.requeue_front((msg, None))
            return False
        if reply is not None and not reply.done():
            reply.set_exception(exc)
        if isinstance(exc, expected):
            if reply is None:
                logger.debug("actor {!r}: {!r} on tell {}", self.name, exc, type(msg).__name__)
            return True
        return False

    # ---- the end of an incarnation -----------------------------------------------------------

    def _end(self, actor: Incarnation, reason: BaseException | None, *, ran: bool) -> None:
        """End an incarnation that has no task: fail what it owes now, clean up in a new task."""
        self.mailbox.cancel_notify()
        owned = self._fail_queued(reason)
        self._task_began = False
        self._task = self.loop.create_task(self._finish(actor, reason, ran, owned),
                                           name=f"actor:{self.name}", context=self._context)

    def _fail_queued(self, reason: BaseException | None) -> dict[asyncio.Future[Any], Any]:
        """First, synchronous part of an incarnation's end: fail what is queued and what owned work
        would have answered, cancel that work; return it for ``_finish`` to wait on."""
        self.state = "stopping"
        if reason is not None:
            logger.opt(exception=reason).error("actor {!r} crashed: {!r}", self.name, reason)
        if self.final or self.hook is None:
            self._fail_envelopes(self.mailbox.close(), reason)
        # else a restart may follow: the mailbox outlives the incarnation. What is queued stays queued
        # for the next one (a tell is processed, an ask answered by it); when no restart follows after
        # all, ``terminate`` closes the mailbox and fails the asks.
        owned, self.owned = self.owned or {}, None
        for fut, reply in owned.items():
            if reply is not None and not reply.done():
                reply.set_exception(self._dead_error(reason))
            fut.cancel()
        return owned

    async def _finish(self, actor: Incarnation, reason: BaseException | None, ran: bool,
                      owned: dict[asyncio.Future[Any], Any]) -> None:
        """Second part (in ``_task``): wait for owned work, stop children, ``on_stop``, then decide."""
        if owned:
            await asyncio.gather(*owned, return_exceptions=True)
        try:
            await actor.stop_children()
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

    def _reply_later(self, actor: Incarnation, result: Awaitable[Any],
                     reply: asyncio.Future[Any] | None) -> None:
        if inspect.iscoroutine(result):
            fut: asyncio.Future[Any] = self.loop.create_task(result, name=f"actor:{self.name}:reply")
        else:
            fut = asyncio.ensure_future(result)
        self._own(fut, reply)
        fut.add_done_callback(partial(self._reply_done, actor, reply))

    def _reply_done(self, actor: Incarnation, reply: asyncio.Future[Any] | None,
                    fut: asyncio.Future[Any]) -> None:
        if not self._disown(fut) or self.actor is not actor:
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

    def _spawned_done(self, actor: Incarnation, task: asyncio.Task[Any]) -> None:
        if not self._disown(task) or self.actor is not actor or task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.request_crash(exc)

    def _own(self, fut: asyncio.Future[Any], reply: asyncio.Future[Any] | None) -> None:
        owned = self.owned
        if owned is None:
            owned = self.owned = {}
        owned[fut] = reply

    def _disown(self, fut: asyncio.Future[Any]) -> bool:
        """Forget ``fut``; False when the incarnation that owned it has already ended."""
        owned = self.owned
        return owned is not None and owned.pop(fut, _MISSING) is not _MISSING

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
