"""MemoryManagerActor's spill trigger: the high watermark with and without Riffle's sensitive mode
(``[hybrid_store] sensitive_watermark_spill_enable``: bytes being spilled count as used) and the live
watermark change of a config reload (``SetWatermarks``).

The MemoryManager is the real actor on a real ``MemoryBudget``; the AppManager is a recorder of the
``SpillLargest`` rounds it is asked for.
"""

from __future__ import annotations

from typing import Any

from riffle_actors.actors.memory import (
    CommitTicket,
    GetBudget,
    MarkInFlight,
    MemoryManagerActor,
    SetWatermarks,
    SpillLargest,
    SpillRoundDone,
)
from riffle_actors.runtime import Actor, ActorRef, ActorSystem, ManualClock
from riffle_actors.state.budget import MemoryBudget
from riffle_actors.state.tickets import TicketBook

CAPACITY = 1000
APP = "app-1"


class RoundRecorder(Actor):
    """Stands for the AppManager: records every spill round asked for."""

    def __init__(self) -> None:
        self.rounds: list[int] = []

    def receive(self, msg: Any) -> Any:
        assert isinstance(msg, SpillLargest)
        self.rounds.append(msg.target_bytes)


async def _rig(system: ActorSystem, clock: ManualClock, *, sensitive: bool) -> tuple[ActorRef, RoundRecorder]:
    rec = RoundRecorder()
    await system.spawn(rec, "app_manager")
    memory = await system.spawn(MemoryManagerActor(
        budget=MemoryBudget(CAPACITY), tickets=TicketBook(clock, 60.0), high_watermark=0.8, low_watermark=0.2,
        clock=clock, sensitive_watermark=sensitive), "memory")  # finds "app_manager" by name
    return memory, rec


async def _hold(memory: ActorRef, used: int, in_flight: int = 0) -> None:
    """``used`` more bytes held by the app, ``in_flight`` of them being spilled; then settle."""
    await memory.tell(CommitTicket(app_id=APP, ticket_size=0, used=used))
    if in_flight:
        await memory.tell(MarkInFlight(app_id=APP, size=in_flight))
    await memory.ask(GetBudget())


async def test_in_flight_bytes_do_not_count_by_default(system: ActorSystem, clock: ManualClock) -> None:
    memory, rec = await _rig(system, clock, sensitive=False)
    await _hold(memory, 600, in_flight=500)
    await _hold(memory, 300)  # used 900 of 1000, 500 of it in flight: 400 not in flight < 800
    assert rec.rounds == []
    await _hold(memory, 450)  # 850 not in flight > 800: spill down to the low watermark (200)
    report = await memory.ask(GetBudget())
    assert (report.budget.used, report.budget.in_flight) == (1350, 500)
    assert rec.rounds == [850 - 200]


async def test_sensitive_mode_counts_in_flight_bytes(system: ActorSystem, clock: ManualClock) -> None:
    memory, rec = await _rig(system, clock, sensitive=True)
    await _hold(memory, 600, in_flight=500)
    assert rec.rounds == []  # used 600 < 800
    await _hold(memory, 300)  # used 900 > 800 with the 500 in flight: a round for the 400 not in flight
    assert rec.rounds == [400 - 200]


async def test_sensitive_mode_skips_when_the_rest_is_below_the_low_watermark(system: ActorSystem,
                                                                             clock: ManualClock) -> None:
    memory, rec = await _rig(system, clock, sensitive=True)
    await _hold(memory, 790, in_flight=750)
    await _hold(memory, 110)  # used 900 > 800, but only 150 not in flight (< 200)
    assert rec.rounds == []
    await _hold(memory, 70)  # 220 not in flight: 20 above the low watermark
    assert rec.rounds == [20]


async def test_set_watermarks_applies_at_once(system: ActorSystem, clock: ManualClock) -> None:
    memory, rec = await _rig(system, clock, sensitive=False)
    await _hold(memory, 600, in_flight=300)  # 300 not in flight, below 800
    assert rec.rounds == []
    await memory.tell(SetWatermarks(high_watermark=0.5, low_watermark=0.1, sensitive=False))
    await memory.ask(GetBudget())
    assert rec.rounds == []  # 300 not in flight is below the new 500 too
    await memory.tell(SetWatermarks(high_watermark=0.5, low_watermark=0.1, sensitive=True))
    await memory.ask(GetBudget())
    assert rec.rounds == [300 - 100]  # used 600 > 500 now that in-flight bytes count
    await memory.tell(SpillRoundDone(0))
    await memory.tell(SetWatermarks(high_watermark=0.25, low_watermark=0.2, sensitive=False))
    await memory.ask(GetBudget())
    assert rec.rounds == [200, 300 - 200]  # 300 not in flight > 250
