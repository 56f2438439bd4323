"""ActorSystem: the per-server registry of actors, the root supervisor, and orderly shutdown.

This module owns the set of live actors of one server (no module globals: two servers in one test
process have two systems):

- ``await system.start()`` creates the root ``Supervisor`` (``system.root``); ``start_child`` with
  ``parent=None`` starts it on demand.
- ``await system.spawn(actor, name=...)`` starts an unsupervised top-level actor: when it crashes it
  stays dead (watchers get ``Terminated``).
- ``await system.start_child(parent, spec)`` / ``stop_child(parent, name)`` / ``children(parent)``
  are the one way to manage supervised actors from outside a supervisor (see ``supervisor.py``).
- Names are unique among live actors; ``system.get(name)`` looks one up; a name is freed when its actor
  stops for good.
- ``system.statistics()`` snapshots every mailbox (for ``/debug/actors`` and gauges).
- ``system.inject_crash(name, after=n)`` (tests and simulations only) crashes an actor at its
  (n+1)-th next message, between two messages; see ``cell.py``.
- ``await system.stop_all()`` stops every actor for good in reverse start order (children before
  their parents), failing every pending ask; afterwards no actor task is left on the loop. Call it
  before the loop ends: an idle actor has no task for the loop's shutdown to cancel, so without it
  ``on_stop`` of idle actors never runs.
- ``system.register(name, actor, exit_hook)`` reserves a name and creates the actor's ``ActorCell``
  without starting it; it is the plumbing under ``spawn`` and ``Supervisor.start_child`` (part of
  ``base.ActorHost``, which ``ActorSystem`` implements).
- When the root supervisor gives up (restart intensity exceeded below it), ``on_escalation(exc)`` is
  called; the default logs at critical level. The server's composition root decides what to do (for
  example trigger a shutdown).

Not covered: per-actor scheduling and processing (``cell.py``), restart decisions (``supervisor.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from loguru import logger

from riffle_actors.runtime.base import Actor, ChildSpec
from riffle_actors.runtime.cell import ActorCell, ActorRef, ExitHook, cell_of
from riffle_actors.runtime.clock import Clock, SystemClock
from riffle_actors.runtime.mailbox import MailboxStatistics
from riffle_actors.runtime.supervisor import StartChild, StopChild, Supervisor

ROOT_NAME = "root"


def _log_escalation(exc: BaseException) -> None:
    logger.opt(exception=exc).critical("root supervisor gave up: {!r}", exc)


class ActorSystem:
    """Registry and lifecycle of all actors of one server; see the module docstring.

    Implements ``base.ActorHost`` (what ``actor.system`` offers an actor).
    """

    def __init__(
        self,
        clock: Clock | None = None,
        on_escalation: Callable[[BaseException], None] | None = None,
        *,
        root_max_restarts: int = 3,
        root_within_s: float = 5.0,
    ) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.on_escalation = on_escalation if on_escalation is not None else _log_escalation
        self._root_max_restarts = root_max_restarts
        self._root_within_s = root_within_s
        self._refs: dict[str, ActorRef] = {}  # insertion order = start order
        self._on_terminated = self._unregister  # one bound method shared by every cell
        self._root: ActorRef | None = None
        self._seq = itertools.count(1)

    # ---- starting ----------------------------------------------------------------------------

    async def start(self) -> ActorRef:
        """Create the root supervisor if it is not running; return its ref."""
        if self._root is None or not self._root.is_alive:
            root = Supervisor(ROOT_NAME, self._root_max_restarts, self._root_within_s, self.clock)
            self._root = await self._start_actor(root, ROOT_NAME, exit_hook=self._root_exited)
        return self._root

    @property
    def root(self) -> ActorRef:
        """The root supervisor's ref; requires ``await start()`` (or a ``start_child`` with parent None)."""
        if self._root is None:
            raise RuntimeError("ActorSystem not started: await system.start() first")
        return self._root

    async def spawn(self, actor: Actor, name: str | None = None) -> ActorRef:
        """Start an unsupervised top-level actor; returns after its ``on_start`` (re-raising failures)."""
        if name is None:
            name = getattr(actor, "default_name", None) or f"{type(actor).__name__}-{next(self._seq)}"
        return await self._start_actor(actor, name)

    async def start_child(self, parent: ActorRef | None, spec: ChildSpec) -> ActorRef:
        """Start ``spec`` under supervisor ``parent`` (root if None); raises ``ChildStartError``."""
        if parent is None:
            parent = await self.start()
        ref: ActorRef = await self._supervisor(parent).ask(StartChild(spec=spec))
        return ref

    async def stop_child(self, parent: ActorRef | None, name: str) -> None:
        """Stop child ``name`` of ``parent`` (root if None) for good."""
        await self._supervisor(parent).ask(StopChild(name=name))

    def children(self, parent: ActorRef | None = None) -> dict[str, ActorRef]:
        """Children of supervisor ``parent`` (root if None) by name; empty while it restarts."""
        ref = self._root if parent is None else parent
        actor = cell_of(ref).actor if ref is not None else None
        return actor.children() if isinstance(actor, Supervisor) else {}

    # ---- inspection --------------------------------------------------------------------------

    def get(self, name: str) -> ActorRef | None:
        """The live actor called ``name``, or None."""
        return self._refs.get(name)

    def statistics(self) -> list[MailboxStatistics]:
        """Mailbox statistics of every live actor, in start order."""
        return [ref.statistics() for ref in list(self._refs.values())]

    # ---- tests ------------------------------------------------------------------------------

    def inject_crash(self, name: str, after: int = 0, error: BaseException | None = None) -> None:
        """Test seam: actor ``name`` crashes with ``InjectedCrash`` in place of the message it handles
        after the next ``after`` ones (see ``cell.py``, "Crash injection"); ``KeyError`` if unknown."""
        ref = self._refs.get(name)
        if ref is None:
            raise KeyError(f"no live actor called {name!r}")
        cell_of(ref).inject_crash(after, error)

    # ---- stopping ----------------------------------------------------------------------------

    async def stop_all(self) -> None:
        """Stop every actor for good, newest first; every pending ask fails with ``ActorDeadError``."""
        while self._refs:
            ref = next(reversed(self._refs.values()))
            await cell_of(ref).stop(final=True)
            self._unregister(ref)  # normally done by the cell; guards against a stuck entry
        self._root = None

    # ---- plumbing for supervisors -------------------------------------------------------------

    def register(self, name: str, actor: Actor, exit_hook: ExitHook | None = None) -> ActorCell:
        """Reserve ``name`` for ``actor``, not started yet: the caller does ``await cell.start(actor)``.

        ``exit_hook`` decides at the end of each incarnation whether a restart follows (a supervisor's);
        None means unsupervised. The name is freed when the actor stops for good.
        """
        if name in self._refs:
            raise ValueError(f"actor name {name!r} is already in use")
        cell = ActorCell(self, name, type(actor).mailbox_size, on_terminated=self._on_terminated)
        cell.hook = exit_hook
        self._refs[name] = cell.ref
        return cell

    # ---- internals -----------------------------------------------------------------------------

    async def _start_actor(self, actor: Actor, name: str, *, exit_hook: ExitHook | None = None) -> ActorRef:
        cell = self.register(name, actor, exit_hook)
        await cell.start(actor)  # on failure the cell has already unregistered itself
        return cell.ref

    def _unregister(self, ref: ActorRef) -> None:
        if self._refs.get(ref.name) is ref:
            del self._refs[ref.name]

    def _supervisor(self, parent: ActorRef | None) -> ActorRef:
        ref = self._root if parent is None else parent
        if ref is None:
            raise RuntimeError("ActorSystem not started: await system.start() first")
        actor = cell_of(ref).actor
        if actor is not None and not isinstance(actor, Supervisor):
            raise TypeError(f"{ref.name!r} is not a Supervisor")
        return ref

    def _root_exited(self, cell: ActorCell, reason: BaseException | None) -> bool:
        if reason is not None:
            try:
                self.on_escalation(reason)
            except Exception:
                logger.exception("on_escalation callback failed")
        return False
