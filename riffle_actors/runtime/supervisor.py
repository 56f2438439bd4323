"""Supervisor (one_for_one): who restarts a crashed actor, and when to give up.

This module owns restart decisions. A ``Supervisor`` is itself an actor; it starts children from
``ChildSpec`` s (defined in ``base.py``) and, when one ends, applies its ``RestartPolicy``:

- ``PERMANENT``: always restarted (after a crash or a normal ``ref.stop()``);
- ``TRANSIENT``: restarted only after a crash;
- ``TEMPORARY``: never restarted.

``stop_child`` (and system shutdown) stop a child for good whatever its policy. A restarted child keeps
its ``ActorRef``; ``factory()`` builds the new instance. More than ``max_restarts`` restarts of one child
within ``within_s`` seconds (measured on the injected ``Clock``) and the supervisor gives up: it stops that
child and all others and crashes itself with ``RestartIntensityExceeded``, escalating to *its* supervisor.
When the root supervisor gives up, ``ActorSystem`` calls its ``on_escalation`` callback.

**How to start children (the one way).** From outside a supervisor, use the system facade, which goes
through the supervisor's mailbox so it is serialised with restarts::

    ref = await system.start_child(parent_ref_or_None, ChildSpec("disk-0", lambda: DiskActor(path)))
    await system.stop_child(parent_ref_or_None, "disk-0")
    system.children(parent_ref_or_None)            # {name: ActorRef}

(``None`` means the root supervisor.) A ``Supervisor`` subclass (e.g. an app manager supervising one
actor per app) calls ``await self.start_child(spec)`` / ``await self.stop_child(name)`` /
``self.children()`` from inside its own ``receive``, and delegates messages it does not know with
``return await super().receive(msg)``; it must keep ``ChildStartError`` in its ``expected_errors``.
Children listed in ``Supervisor(children=[...])`` are (re)started by every incarnation's ``on_start``,
so a restarted supervisor brings its static subtree back.

**Children that outlive the supervisor's crash.** By default a supervisor's crash stops its
children (Erlang). A supervisor given a ``ChildTable`` (``Supervisor(table=t)``, the same table
handed to every incarnation by its factory) leaves them running instead: the table holds their
specs, refs and restart histories, the next incarnation takes them over (static children are
started only if missing), and an exit of a child while no incarnation runs waits in the
supervisor's mailbox. Only a stop for good (``stop_child``, shutdown) stops them. For a supervisor
of many dynamic children whose loss would lose data (the AppActors of a server). If the supervisor
is not restarted after all (its own parent gave up), its children stay until ``stop_all``. ``StartChild`` / ``StopChild`` are the
messages behind the system facade (runtime-internal: not exported by the package).

A child is registered through ``actor.system.register`` with this supervisor's exit hook, and managed
through its ``ActorCell`` (``cell_of(ref)``); this module does not import ``system.py``. A child that is
idle costs the supervisor only its ``ChildSpec`` and ref: the restart history is created on its first
restart.

Not covered: how an actor runs and dies (``cell.py``), the registry and shutdown (``system.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from loguru import logger

from riffle_actors.runtime.base import Actor, ChildSpec, RestartPolicy
from riffle_actors.runtime.cell import ActorCell, ActorRef, cell_of, tell_control
from riffle_actors.runtime.clock import Clock
from riffle_actors.runtime.mailbox import ActorDeadError


class ChildStartError(Exception):
    """A child could not be started (name in use, factory or ``on_start`` failed; see ``__cause__``)."""


class RestartIntensityExceeded(Exception):
    """A child needed more than ``max_restarts`` restarts within ``within_s``; the supervisor gave up."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StartChild:
    """Ask a supervisor to start ``spec``; answered with the child's ref (``ActorSystem.start_child``)."""

    spec: ChildSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class StopChild:
    """Ask a supervisor to stop child ``name`` for good (``ActorSystem.stop_child``)."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class _ChildExited:
    name: str
    cell: ActorCell
    reason: BaseException | None
    restart: bool


class ChildTable(dict[str, "_Child"]):
    """name -> child of a supervisor whose children outlive its own crash (``Supervisor(table=...)``)."""


@dataclass(slots=True)
class _Child:
    spec: ChildSpec
    ref: ActorRef
    restart_times: deque[float] | None = None  # monotonic times of recent restarts; made on the first


def _build(spec: ChildSpec) -> Actor:
    actor = spec.factory()
    if not isinstance(actor, Actor) or hasattr(actor, "ref"):
        raise TypeError(f"factory of {spec.name!r} must return a new, never started Actor, got {actor!r}")
    return actor


class Supervisor(Actor):
    """One-for-one supervisor; see the module docstring for the API and policies.

    ``name`` is only the default registered name for ``system.spawn`` (a ``ChildSpec`` name wins).
    ``clock`` defaults to the system's clock. ``children`` are started, in order, by every incarnation.
    ``restart_backoff_s`` delays each restart on the clock; it blocks this supervisor's mailbox, so
    keep it tiny (default 0).
    """

    mailbox_size = 100_000
    expected_errors: ClassVar[tuple[type[BaseException], ...]] = (ChildStartError,)

    def __init__(
        self,
        name: str = "supervisor",
        max_restarts: int = 3,
        within_s: float = 5.0,
        clock: Clock | None = None,
        *,
        children: Sequence[ChildSpec] = (),
        restart_backoff_s: float = 0.0,
        table: ChildTable | None = None,
    ) -> None:
        self.default_name = name  # used by ``system.spawn`` when no name is given
        self.max_restarts = max_restarts
        self.within_s = within_s
        self.clock = clock
        self.restart_backoff_s = restart_backoff_s
        self._static = tuple(children)
        self._keeps_children = table is not None
        self._children: dict[str, _Child] = table if table is not None else {}
        self._shutting_down = False

    async def on_start(self) -> None:
        if self.clock is None:
            self.clock = self.system.clock
        for name, child in list(self._children.items()):  # kept from the last incarnation (``table``)
            if cell_of(child.ref).state == "stopped":
                del self._children[name]
        for spec in self._static:
            if spec.name not in self._children:
                await self.start_child(spec)

    async def receive(self, msg: Any) -> Any:
        match msg:
            case _ChildExited():
                await self._child_exited(msg)
            case StartChild(spec=spec):
                return await self.start_child(spec)
            case StopChild(name=name):
                await self.stop_child(name)
            case _:
                raise TypeError(f"supervisor {self.name!r}: unexpected message {msg!r}")

    # ---- child management (call from inside this actor) ----------------------------------------

    async def start_child(self, spec: ChildSpec) -> ActorRef:
        """Start ``spec`` under this supervisor and return its ref; ``ChildStartError`` on failure."""
        existing = self._children.get(spec.name)
        if existing is not None and existing.ref.is_alive:
            raise ChildStartError(f"supervisor {self.name!r} already has a child {spec.name!r}")
        try:
            actor = _build(spec)
            cell = self.system.register(spec.name, actor, self._on_child_exit)
        except Exception as exc:
            raise ChildStartError(f"child {spec.name!r} of {self.name!r} not created: {exc!r}") from exc
        # Registered before starting so that a crash right after on_start is already supervised.
        self._children[spec.name] = _Child(spec, cell.ref)
        try:
            await cell.start(actor)
        except Exception as exc:
            if (child := self._children.get(spec.name)) is not None and child.ref is cell.ref:
                del self._children[spec.name]
            raise ChildStartError(f"child {spec.name!r} of {self.name!r} failed to start: {exc!r}") from exc
        return cell.ref

    async def stop_child(self, name: str) -> None:
        """Stop child ``name`` for good, whatever its policy (no-op if unknown)."""
        child = self._children.pop(name, None)
        if child is not None:
            await cell_of(child.ref).stop(final=True)

    def children(self) -> dict[str, ActorRef]:
        """Current children by name, in start order."""
        return {name: child.ref for name, child in self._children.items()}

    # ---- runtime hooks -----------------------------------------------------------------------

    def _on_child_exit(self, cell: ActorCell, reason: BaseException | None) -> bool:
        # Runs synchronously at the end of the child's incarnation: decide the policy now, count and act
        # in receive.
        child = self._children.get(cell.name)
        if self._shutting_down or child is None or cell_of(child.ref) is not cell:
            return False
        policy = child.spec.restart
        crashed = reason is not None
        restart = policy is RestartPolicy.PERMANENT or (policy is RestartPolicy.TRANSIENT and crashed)
        try:
            tell_control(self.ref, _ChildExited(name=cell.name, cell=cell, reason=reason, restart=restart))
        except ActorDeadError:
            return False
        return restart

    async def _child_exited(self, msg: _ChildExited) -> None:
        child = self._children.get(msg.name)
        if child is None or cell_of(child.ref) is not msg.cell:
            return
        cell = msg.cell
        if not msg.restart or cell.state != "restarting":
            self._forget_if_stopped(child)
            return
        assert self.clock is not None
        now = self.clock.monotonic()
        times = child.restart_times
        if times is None:
            times = child.restart_times = deque()
        while times and times[0] <= now - self.within_s:
            times.popleft()
        if len(times) >= self.max_restarts:
            del self._children[msg.name]
            cell.terminate(msg.reason)
            raise RestartIntensityExceeded(
                f"supervisor {self.name!r}: child {msg.name!r} ended again after {len(times)} restart(s) "
                f"within {self.within_s}s; giving up"
            ) from msg.reason
        times.append(now)
        if self.restart_backoff_s > 0:  # blocks this supervisor's mailbox: keep it tiny
            await self.clock.sleep(self.restart_backoff_s)
            if cell.state != "restarting":  # stopped for good meanwhile
                self._forget_if_stopped(child)
                return
        logger.info("supervisor {!r}: restarting {!r} after {!r}", self.name, msg.name, msg.reason)
        try:
            actor = _build(child.spec)
        except Exception as exc:  # counts as one more failed restart
            logger.opt(exception=exc).error("supervisor {!r}: factory of {!r} failed", self.name, msg.name)
            tell_control(self.ref, _ChildExited(name=msg.name, cell=cell, reason=exc, restart=True))
            return
        cell.restart(actor)

    def _forget_if_stopped(self, child: _Child) -> None:
        if cell_of(child.ref).state == "stopped" and self._children.get(child.spec.name) is child:
            del self._children[child.spec.name]

    async def stop_children(self) -> None:
        if self._keeps_children and not cell_of(self.ref).final:
            # a crash or restart of this supervisor: its children run on, the next incarnation takes
            # them over with the table (their exits reach it through the ref, which survives)
            return
        self._shutting_down = True
        for name in reversed(list(self._children)):
            child = self._children.pop(name)
            await cell_of(child.ref).stop(final=True)
