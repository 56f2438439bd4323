"""DiskHealthBoard: quarantine, OVERUSED watermarks and probation, without an event loop (and a lost
probe round through the DiskMonitor, on a manual clock)."""

from __future__ import annotations

import errno

import pytest

from riffle_actors.actors.disk_monitor import DiskMonitorActor
from riffle_actors.actors.storage_messages import RunProbeRound
from riffle_actors.io.local import IOErrorKind, classify
from riffle_actors.io.probe import ProbeResult, probe_disk
from riffle_actors.runtime import ActorSystem, ManualClock
from riffle_actors.state.disk_health import DiskHealthBoard, DiskStatus, HealthPolicy

GIB = 1 << 30


def ok(used_ratio: float = 0.1) -> ProbeResult:
    return ProbeResult(True, capacity_bytes=100 * GIB, used_bytes=int(used_ratio * 100 * GIB))


def failed(kind: str, op: str = "write") -> ProbeResult:
    return ProbeResult(False, capacity_bytes=100 * GIB, used_bytes=10 * GIB, kind=kind, op=op, detail="boom")


@pytest.fixture
def board() -> DiskHealthBoard:
    return DiskHealthBoard([("0:a", "/data/a"), ("1:b", "/data/b")],
                           HealthPolicy(high_watermark=0.8, low_watermark=0.7, failures_to_quarantine=3,
                                        probation_probes=3))


def test_classify_uses_errno_not_messages():
    assert classify(OSError(errno.ENOSPC, "x")) is IOErrorKind.ENOSPC
    assert classify(OSError(errno.EDQUOT, "x")) is IOErrorKind.ENOSPC
    assert classify(OSError(errno.EIO, "no space left")) is IOErrorKind.EIO
    assert classify(OSError(errno.EROFS, "x")) is IOErrorKind.EROFS
    assert classify(TimeoutError()) is IOErrorKind.TIMEOUT
    assert classify(OSError(errno.EACCES, "x")) is IOErrorKind.OTHER
    assert classify(RuntimeError("EIO")) is IOErrorKind.OTHER


def test_failed_probe_quarantines_at_once_and_names_the_failure(board):
    change = board.on_probe("0:a", failed("EROFS"), now=10.0)
    assert change is not None and not change.healthy
    assert change.status is DiskStatus.QUARANTINED
    assert "EROFS on write probe" in change.reason and "quarantined" in change.reason
    assert board.placeable_disks() == ["1:b"]
    assert board["0:a"].since_monotonic == 10.0


def test_probation_needs_consecutive_healthy_probes(board):
    board.on_probe("0:a", failed("EIO"), now=0.0)
    assert board.on_probe("0:a", ok(), 1.0) is None
    assert board["0:a"].status is DiskStatus.PROBATION
    assert "probation 1/3" in board.reasons()["0:a"]
    board.on_probe("0:a", ok(), 2.0)
    # a failure during probation starts it over
    assert board.on_probe("0:a", failed("EIO", "fsync"), 3.0) is None
    assert board["0:a"].status is DiskStatus.QUARANTINED and board["0:a"].op == "fsync probe"
    for t in (4.0, 5.0):
        assert board.on_probe("0:a", ok(), t) is None
    change = board.on_probe("0:a", ok(), 6.0)
    assert change is not None and change.healthy and "re-admitted after 3 healthy probation probes" in change.reason
    assert board.placeable("0:a") and board["0:a"].since_monotonic is None


def test_overused_until_below_low_watermark(board):
    change = board.on_probe("1:b", ok(0.85), 0.0)
    assert change is not None and change.status is DiskStatus.OVERUSED and "85% used" in change.reason
    assert board.on_probe("1:b", ok(0.75), 1.0) is None  # between the watermarks: still overused
    assert not board.placeable("1:b")
    change = board.on_probe("1:b", ok(0.5), 2.0)
    assert change is not None and change.healthy and "below disk_low_watermark" in change.reason


def test_enospc_quarantine_is_lifted_only_below_low_watermark(board):
    board.on_io_failure("0:a", "ENOSPC", "spill write", "No space left on device", 0.0)
    for t in range(5):
        board.on_probe("0:a", ok(0.75), float(t))
    assert board["0:a"].status is DiskStatus.QUARANTINED and board["0:a"].healthy_probes == 0
    for t in range(3):
        change = board.on_probe("0:a", ok(0.2), 10.0 + t)
    assert change is not None and change.healthy


def test_eio_quarantines_after_repeated_failures_only(board):
    assert board.on_io_failure("0:a", "EIO", "spill write", "", 0.0) is None
    board.on_io_success("0:a")  # a success resets the count
    assert board.on_io_failure("0:a", "EIO", "spill write", "", 1.0) is None
    assert board.on_io_failure("0:a", "EIO", "spill write", "", 2.0) is None
    change = board.on_io_failure("0:a", "EIO", "spill write", "Input/output error", 3.0)
    assert change is not None and "EIO on spill write (Input/output error)" in change.reason


@pytest.mark.parametrize("kind", ["ENOSPC", "EROFS", "TIMEOUT", "CORRUPT"])
def test_fatal_kinds_quarantine_on_first_failure(board, kind):
    change = board.on_io_failure("1:b", kind, "spill write", "", 0.0)
    assert change is not None and not change.healthy


class _NoVerdictFleet:
    """A ``ProbeFleet`` stand-in whose rounds give no verdict (the probing machinery itself failed)."""

    running = True
    starts = 0
    killed_pids = ()
    stop_requested = None

    def probe(self, targets, timeout_s):
        return {t.disk: None for t in targets}

    def worker_pids(self):
        return {}

    def shutdown(self):
        self.running = False


async def test_a_lost_probe_changes_nothing(board):
    system = ActorSystem(clock=ManualClock())
    await system.start()
    try:
        monitor = await system.spawn(DiskMonitorActor(board=board, probe_timeout_s=1.0, interval_s=1.0,
                                                      probe_fn=probe_disk, fleet_factory=_NoVerdictFleet))
        assert await monitor.ask(RunProbeRound()) == {"0:a": None, "1:b": None}
        assert board.placeable_disks() == ["0:a", "1:b"]
        assert board["0:a"].probes_total == 0 and board["1:b"].probes_total == 0
    finally:
        await system.stop_all()


def test_which_kinds_count_is_decided_in_one_place(board):
    """The board quarantines at once exactly the kinds ``IOErrorKind`` says; only kinds that blame
    the disk are reported to it at all."""
    for kind in IOErrorKind:
        fresh = DiskHealthBoard([("d", "/d")], board.policy)
        change = fresh.on_io_failure("d", kind, "spill write", "", 0.0)
        assert (change is not None) is kind.quarantines_at_once, kind
    assert {k for k in IOErrorKind if k.blames_disk} == {"ENOSPC", "EIO", "EROFS", "TIMEOUT", "CORRUPT"}
