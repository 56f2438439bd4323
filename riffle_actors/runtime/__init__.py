"""The in-process asyncio actor runtime: actors, refs, mailboxes, supervisors, timers, the injected clock.

It imports nothing of the shuffle domain; code outside this package imports only the names below, never
a submodule. The modules, each owning one thing, and their imports (acyclic; each module uses only the
public names of the ones below it):

- ``mailbox.py``: the bounded mailbox, its statistics, ``ActorDeadError`` / ``MailboxFullError``;
- ``clock.py``: ``Clock``, ``SystemClock``, ``ManualClock``;
- ``slicing.py``: ``SliceLane``, long state operations of one actor run in bounded time slices;
- ``cell.py`` (mailbox): ``ActorRef``, ``Terminated``, ``InjectedCrash``, ``Forward`` and the per-actor cell: scheduling, processing,
  failure, stop and death-watch semantics. An idle actor costs no task: it is scheduled only while it
  has mail;
- ``base.py`` (cell, clock, mailbox): ``Actor``, ``ChildSpec``, ``RestartPolicy``, and ``ActorHost``,
  what an actor sees of its system;
- ``supervisor.py`` (base, cell, clock, mailbox): ``Supervisor``, its ``ChildTable`` and restart decisions;
- ``timer.py`` (base, cell, clock, mailbox): ``TimerActor`` and its ``TimerTable``, every deadline of a server;
- ``periodic.py`` (base, cell, mailbox, timer): ``PeriodicJobActor``, one periodic async job woken by the
  timer (no sleeping loops);
- ``system.py`` (base, cell, supervisor, clock, mailbox): ``ActorSystem``, the registry, the root
  supervisor and shutdown;
- ``lifecycle.py`` (nothing of the runtime): ``StartSequence`` and its ``Step``s, a daemon's ordered start
  with rollback and its stop in the reverse order.
"""

from riffle_actors.runtime.base import Actor, ActorHost, ChildSpec, RestartPolicy
from riffle_actors.runtime.cell import ActorRef, Forward, InjectedCrash, Terminated
from riffle_actors.runtime.clock import Cancellable, Clock, ManualClock, SystemClock
from riffle_actors.runtime.lifecycle import StartAborted, StartSequence, Step
from riffle_actors.runtime.mailbox import ActorDeadError, MailboxFullError, MailboxStatistics
from riffle_actors.runtime.periodic import PeriodicJobActor, RunJob
from riffle_actors.runtime.slicing import SliceLane
from riffle_actors.runtime.supervisor import ChildStartError, ChildTable, RestartIntensityExceeded, Supervisor
from riffle_actors.runtime.system import ActorSystem
from riffle_actors.runtime.timer import Cancel, FireDue, Schedule, ScheduleEvery, TimerActor, TimerTable

__all__ = [
    "Actor",
    "ActorDeadError",
    "ActorHost",
    "ActorRef",
    "ActorSystem",
    "Cancel",
    "Cancellable",
    "ChildSpec",
    "ChildStartError",
    "ChildTable",
    "Clock",
    "FireDue",
    "Forward",
    "InjectedCrash",
    "MailboxFullError",
    "MailboxStatistics",
    "ManualClock",
    "RestartIntensityExceeded",
    "PeriodicJobActor",
    "RestartPolicy",
    "RunJob",
    "Schedule",
    "ScheduleEvery",
    "SliceLane",
    "StartAborted",
    "StartSequence",
    "Step",
    "Supervisor",
    "SystemClock",
    "Terminated",
    "TimerActor",
    "TimerTable",
]
