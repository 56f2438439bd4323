"""The in-process asyncio actor runtime: actors, refs, mailboxes, supervisors, timers, the injected clock.

It imports nothing of the shuffle domain; the server's and coordinator's actors import its public
names from here. See ``base.py`` for processing and failure semantics, ``supervisor.py`` for restarts
and how to start children, ``timer.py`` for deadlines, ``clock.py`` for real and manual time,
``slicing.py`` for running long work in bounded steps.
"""

from riffle_actors.runtime.base import Actor, ActorRef, Terminated
from riffle_actors.runtime.clock import Cancellable, Clock, ManualClock, SystemClock
from riffle_actors.runtime.mailbox import ActorDeadError, MailboxFullError, MailboxStatistics
from riffle_actors.runtime.supervisor import (
    ChildSpec,
    ChildStartError,
    RestartIntensityExceeded,
    RestartPolicy,
    Supervisor,
)
from riffle_actors.runtime.system import ActorSystem
from riffle_actors.runtime.timer import Cancel, FireDue, Schedule, ScheduleEvery, TimerActor

__all__ = [
    "Actor",
    "ActorDeadError",
    "ActorRef",
    "ActorSystem",
    "Cancel",
    "Cancellable",
    "ChildSpec",
    "ChildStartError",
    "Clock",
    "FireDue",
    "MailboxFullError",
    "MailboxStatistics",
    "ManualClock",
    "RestartIntensityExceeded",
    "RestartPolicy",
    "Schedule",
    "ScheduleEvery",
    "Supervisor",
    "SystemClock",
    "Terminated",
    "TimerActor",
]
