"""Actor, the base class of every actor, and what an actor sees of the system that runs it.

This module owns the programming model:

- ``Actor``: subclass it and implement ``receive``; ``on_start`` / ``on_stop`` run around every
  incarnation; ``spawn`` starts a task the incarnation owns; ``stop_self`` ends it from a plain
  ``receive``. How messages are scheduled and processed, and what a failure does, is in ``cell.py``.
- ``ActorHost``: the protocol of ``actor.system``, i.e. what an actor may ask of the system that runs
  it (its clock, starting and stopping other actors, looking one up). ``system.ActorSystem`` implements
  it; this module never imports ``system.py``, so the runtime's imports stay acyclic.
- ``ChildSpec`` and ``RestartPolicy``: how to describe a supervised actor. They live here, next to
  ``Actor``, because ``ActorHost.start_child`` takes them; ``supervisor.py`` applies them.

Not covered: scheduling, failures and refs (``cell.py``), restart decisions (``supervisor.py``), the
registry and shutdown (``system.py``).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from riffle_actors.runtime.cell import ActorCell, ActorRef, ExitHook, cell_of
from riffle_actors.runtime.clock import Clock
from riffle_actors.runtime.mailbox import ActorDeadError, MailboxStatistics

T = TypeVar("T")


class Actor:
    """Base class of every actor; subclass it and implement ``receive``.

    The runtime sets ``ref``, ``system`` and ``name`` before ``on_start`` runs, so ``__init__`` is free
    to take whatever the actor needs and does not have to call ``super().__init__()``.
    """

    mailbox_size: ClassVar[int] = 10_000
    expected_errors: ClassVar[tuple[type[BaseException], ...]] = ()

    ref: ActorRef
    system: ActorHost
    name: str

    def receive(self, msg: Any) -> Any:
        """Handle one message; the return value answers an ask. See ``cell.py`` for the semantics."""
        raise NotImplementedError(f"{type(self).__name__} must implement receive()")

    async def on_start(self) -> None:
        """Runs before the first message of every incarnation; raising fails the start."""

    async def on_stop(self) -> None:
        """Runs after the last message of every incarnation (normal stop, crash, before a restart)."""

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coro`` as a task owned by this incarnation: cancelled when it ends, crashes it on error."""
        ref: ActorRef | None = getattr(self, "ref", None)
        if ref is None:
            coro.close()
            raise ActorDeadError(f"actor {type(self).__name__!r} is not running")
        return cell_of(ref).spawn_owned(self, coro)

    def stop_self(self) -> None:
        """Stop after the current message; for a plain ``receive``, which cannot ``await ref.stop()``."""
        cell_of(self.ref).request_stop()

    async def stop_children(self) -> None:
        """Runtime hook at the end of every incarnation, before ``on_stop``: a ``Supervisor`` stops its
        children here. Other actors have none; do not call it yourself."""


class RestartPolicy(enum.Enum):
    """Erlang restart types; see ``supervisor.py``."""

    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """How to (re)build one child: its unique name, a factory for fresh instances, its restart policy."""

    name: str
    factory: Callable[[], Actor]
    restart: RestartPolicy = RestartPolicy.PERMANENT


class ActorHost(Protocol):
    """What an actor may use of the system that runs it (``actor.system``); see ``system.ActorSystem``."""

    clock: Clock

    async def spawn(self, actor: Actor, name: str | None = None) -> ActorRef:
        """Start an unsupervised top-level actor."""
        ...

    async def start_child(self, parent: ActorRef | None, spec: ChildSpec) -> ActorRef:
        """Start ``spec`` under supervisor ``parent`` (the root if None)."""
        ...

    async def stop_child(self, parent: ActorRef | None, name: str) -> None:
        """Stop child ``name`` of ``parent`` (the root if None) for good."""
        ...

    def children(self, parent: ActorRef | None = None) -> dict[str, ActorRef]:
        """Children of supervisor ``parent`` (the root if None) by name."""
        ...

    def get(self, name: str) -> ActorRef | None:
        """The live actor called ``name``, or None."""
        ...

    def statistics(self) -> list[MailboxStatistics]:
        """Mailbox statistics of every live actor."""
        ...

    def register(self, name: str, actor: Actor, exit_hook: ExitHook | None = None) -> ActorCell:
        """Reserve ``name`` for ``actor``, not started yet (for supervisors: ``await cell.start(actor)``)."""
        ...
