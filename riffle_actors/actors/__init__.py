"""The in-process asyncio actor runtime and the server's actors.

This package ``__init__`` re-exports only the runtime API (``mailbox``, ``base``, ``supervisor``,
``system``, ``timer``); the server's actors (memory, app, disk, ...) are imported from their own modules.
See ``base.py`` for processing and failure semantics, ``supervisor.py`` for restarts and how to start
children, ``timer.py`` for deadlines.
"""

from riffle_actors.actors.base import Actor, ActorRef, Terminated
from riffle_actors.actors.mailbox import ActorDeadError, MailboxFullError, MailboxStatistics
from riffle_actors.actors.supervisor import (
    ChildSpec,
    ChildStartError,
    RestartIntensityExceeded,
    RestartPolicy,
    Supervisor,
)
from riffle_actors.actors.system import ActorSystem
from riffle_actors.actors.timer import Cancel, FireDue, Schedule, ScheduleEvery, TimerActor

__all__ = [
    "Actor",
    "ActorDeadError",
    "ActorRef",
    "ActorSystem",
    "Cancel",
    "ChildSpec",
    "ChildStartError",
    "FireDue",
    "MailboxFullError",
    "MailboxStatistics",
    "RestartIntensityExceeded",
    "RestartPolicy",
    "Schedule",
    "ScheduleEvery",
    "Supervisor",
    "Terminated",
    "TimerActor",
]
