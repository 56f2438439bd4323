"""The fuzz harnesses in CI: short seeded atheris runs, and hand-made tricky inputs replayed in-process.

This module owns the CI budget of ``tests.fuzz.harnesses``:

- ``test_seeded_fuzz_run_finds_no_crash``: each harness runs in its own ``python3 -m tests.fuzz.run``
  process (``atheris.Fuzz()`` never returns) with a fixed ``-seed``, a bounded ``-runs`` and a seed
  corpus of valid encodings written to a temporary directory. A crash, timeout or out-of-memory
  fails the test, which prints the saved input and the command that replays it.
  The coordinator's harnesses (heartbeat, assignment, app request, applications filter) run here too.
  Without atheris the module is skipped, and fails under ``RIFFLE_TESTS_REQUIRE_ALL=1``.
- ``test_selftest_crash_is_reported``: the planted ``_selftest`` crash proves a crash does fail a run.
- the replay tests: truncated headers, huge counts, negative sizes and out-of-range ints go through
  the harnesses directly; inputs whose length fields claim more than they carry must be rejected, and
  no decoder may allocate (in Python) much more than the size of its input.

Longer runs: ``scripts/fuzz.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import atheris  # noqa: F401  a dev dependency: missing, the module fails to import (no silent skip)
import pytest
from pyroaring import BitMap

from riffle_actors.protocol.bitmap import MAX_ID, BlockIdSet, TaskIdFilter
from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.protocol.index import IndexEntry, decode_index
from riffle_actors.records import Block
from tests.fuzz.harnesses import (
    HARNESSES,
    check_block_id_layout,
    check_index_fields,
    check_reported_ids,
    write_seed_corpus,
)
from tests.fuzz.run import SELFTEST, SELFTEST_CRASH

REPO = Path(__file__).resolve().parents[2]
SEED = 8_007  # issue 8, item 7
RUNS = 10_000  # per harness: about 0.5-3 s each on one core, after ~0.5 s of start-up
PROCESS_TIMEOUT_S = 120  # a hung run fails the test instead of the whole session
INPUT_TIMEOUT_S = 10  # libFuzzer -timeout: one input this slow is a denial of service


def h(text: str) -> bytes:
    """Hex laid out field by field; whitespace is ignored."""
    return bytes.fromhex("".join(text.split()))


@pytest.fixture
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="riffle-fuzz-") as directory:
        yield Path(directory)


def _run_fuzzer(name: str, corpus: Path, artifacts: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    artifacts.mkdir(parents=True, exist_ok=True)
    python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=python_path)
    command = [
        sys.executable, "-m", "tests.fuzz.run", name, str(corpus),
        f"-seed={SEED}", f"-runs={RUNS}", f"-timeout={INPUT_TIMEOUT_S}",
        f"-artifact_prefix={artifacts}{os.sep}", "-print_final_stats=1", *flags,
    ]  # fmt: skip
    return subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, check=False
    )


def _keep(artifacts: Path) -> list[Path]:
    """Move what libFuzzer saved (crash-*, timeout-*, oom-*) out of the temporary directory."""
    found = sorted(artifacts.iterdir())
    if not found:
        return []
    keep_dir = Path(tempfile.mkdtemp(prefix="riffle-fuzz-crash-"))
    return [Path(shutil.move(str(path), keep_dir / path.name)) for path in found]


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_seeded_fuzz_run_finds_no_crash(name: str, workdir: Path) -> None:
    corpus = workdir / "corpus"
    assert write_seed_corpus(name, corpus) > 0
    result = _run_fuzzer(name, corpus, workdir / "artifacts")
    saved = _keep(workdir / "artifacts")
    if result.returncode != 0 or saved:
        report = [f"harness {name!r} crashed (exit {result.returncode})"]
        for path in saved:
            report.append(f"input: {path} ({path.stat().st_size} bytes): {path.read_bytes()[:256].hex()}")
            report.append(f"replay: python3 -m tests.fuzz.run {name} {path}")
        report.append(result.stdout[-3000:])  # atheris prints the Python traceback here
        report.append(result.stderr[-3000:])
        pytest.fail("\n".join(report), pytrace=False)
    executed = re.search(r"stat::number_of_executed_units:\s*(\d+)", result.stderr)
    assert executed and int(executed.group(1)) >= RUNS, result.stderr[-2000:]


def test_selftest_crash_is_reported(workdir: Path) -> None:
    corpus = workdir / "corpus"
    corpus.mkdir()
    (corpus / "planted").write_bytes(SELFTEST_CRASH)
    result = _run_fuzzer(SELFTEST, corpus, workdir / "artifacts")
    assert result.returncode != 0
    assert "IndexError: selftest: the planted crash" in result.stdout + result.stderr
    crashes = list((workdir / "artifacts").glob("crash-*"))
    assert [path.read_bytes() for path in crashes] == [SELFTEST_CRASH]


# --------------------------------------------------------------------------------------
# Hand-made tricky inputs, replayed in-process
# --------------------------------------------------------------------------------------

ONE_TWO_THREE = h("00 00000001 00000000 3a300000 01000000 0000 0200 10000000 0100 0200 0300")


def _full_run_containers(n: int) -> bytes:
    """One bucket of ``n`` run containers, each covering all 65536 values: 2**16 * n ids in ~14 n bytes."""
    bitmap = BitMap(range(n << 16))
    bitmap.run_optimize()
    return h("00 00000001 00000000") + bitmap.serialize()


ACCEPT, REJECT = "accept", "reject"
TRICKY_BITMAPS: list[tuple[str, bytes, str]] = [
    ("zero length", b"", ACCEPT),
    ("flag only", h("00"), REJECT),
    ("half a count", h("00 0000"), REJECT),
    ("empty map", h("00 00000000"), ACCEPT),
    ("signedLongs 0xff", h("ff 00000000"), ACCEPT),
    ("trailing byte", h("00 00000000 00"), REJECT),
    ("count -1", h("00 ffffffff"), REJECT),
    ("count INT_MIN", h("00 80000000"), REJECT),
    ("count INT_MAX, no buckets", h("00 7fffffff"), REJECT),
    ("count INT_MAX, one bucket", h("00 7fffffff 00000000 3a300000 00000000"), REJECT),
    ("count 2, one bucket", h("00 00000002 00000000 3a300000 00000000"), REJECT),
    ("high >= 2**31", h("00 00000001 80000000 3a300000 00000000"), REJECT),
    ("high 0xffffffff", h("00 00000001 ffffffff 3a300000 00000000"), REJECT),
    ("truncated high", h("00 00000001 0000"), REJECT),
    ("truncated cookie", h("00 00000001 00000000 3a30"), REJECT),
    ("unknown cookie", h("00 00000001 00000000 3c300000 00000000"), REJECT),
    ("12346 with high bits", h("00 00000001 00000000 3a300100 00000000"), REJECT),
    ("container count 2**32-1", h("00 00000001 00000000 3a300000 ffffffff"), REJECT),
    ("container count 65537", h("00 00000001 00000000 3a300000 01000100"), REJECT),
    ("65536 containers, no tables", h("00 00000001 00000000 3a300000 00000100"), REJECT),
    ("12347, 65536 containers, no flags", h("00 00000001 00000000 3b30ffff"), REJECT),
    ("run count 0xffff, one run", h("00 00000001 00000000 3b300000 01 0000 0000 ffff 0000 0000"), REJECT),
    ("zero runs", h("00 00000001 00000000 3b300000 01 0000 0000 0000"), REJECT),
    ("run past 65535", h("00 00000001 00000000 3b300000 01 0000 0000 0100 ffff ffff"), REJECT),
    ("array of 4096, no values", h("00 00000001 00000000 3a300000 01000000 0000 ff0f 10000000"), REJECT),
    ("bitset, no words", h("00 00000001 00000000 3a300000 01000000 0000 ffff 10000000"), REJECT),
    ("unsorted array", ONE_TWO_THREE[:-6] + h("0300 0200 0100"), REJECT),
    (
        "keys out of order",
        h("00 00000001 00000000 3a300000 02000000 0100 0000 0000 0000 18000000 1a000000 0100 0100"),
        REJECT,
    ),
    ("spec {1,2,3}", ONE_TWO_THREE, ACCEPT),
    ("{1,2,3} minus a byte", ONE_TWO_THREE[:-1], REJECT),
    ("repeated high", h("00 00000002") + ONE_TWO_THREE[5:] + ONE_TWO_THREE[5:], ACCEPT),
    (
        "replaced bucket unsorted",
        h("00 00000002") + ONE_TWO_THREE[5:-6] + h("0300 0200 0100") + ONE_TWO_THREE[5:],
        REJECT,
    ),
    ("1000 empty buckets", h("00 000003e8") + h("00000001 3a300000 00000000") * 1000, ACCEPT),
    ("2**28 ids in 57 KiB", _full_run_containers(4096), ACCEPT),
    ("2**28 ids, one byte short", _full_run_containers(4096)[:-1], REJECT),
]

TRICKY_INDEX = [b"", bytes(39), bytes(40), b"\xff" * 40, b"\xff" * 41, b"\x80" * 119, bytes(4000)]

TRICKY_FDP_BYTES = [b"", b"\x00", b"\xff", bytes(64), b"\xff" * 64, b"\x7f\xff\xff\xff" * 64, b"\x80" * 2048]

_PYTHON_ALLOCATION_BUDGET = 256 * 1024  # plus 16x the input: CRoaring's mallocs are not traced


def _python_peak(decode: Callable[[bytes], object], data: bytes) -> int:
    """Peak bytes allocated through Python's allocators while ``decode(data)`` runs."""
    was_tracing = tracemalloc.is_tracing()  # python -X tracemalloc: measure, but leave it running
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        try:
            decode(data)
        except ProtocolError:
            pass
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        if not was_tracing:
            tracemalloc.stop()


def _accepts(decode: Callable[[bytes], object], data: bytes) -> bool:
    try:
        decode(data)
    except ProtocolError:
        return False
    return True


@pytest.mark.parametrize("label, data, expected", TRICKY_BITMAPS, ids=[t[0] for t in TRICKY_BITMAPS])
def test_tricky_bitmaps_replay_through_the_harnesses(label: str, data: bytes, expected: str) -> None:
    HARNESSES["block_id_set"].fn(data)
    HARNESSES["task_id_filter"].fn(data)
    for decode in (BlockIdSet.deserialize, TaskIdFilter.from_bytes):
        assert _accepts(decode, data) == (expected == ACCEPT), f"{decode.__qualname__} on {label}"
        peak = _python_peak(decode, data)
        assert peak <= _PYTHON_ALLOCATION_BUDGET + 16 * len(data), f"{label}: {peak} bytes for {len(data)}"


def test_a_small_input_can_hold_billions_of_ids_without_being_listed() -> None:
    ids = BlockIdSet.deserialize(_full_run_containers(4096))
    assert len(ids) == 1 << 28
    assert (1 << 28) - 1 in ids and 1 << 28 not in ids


@pytest.mark.parametrize("data", TRICKY_INDEX, ids=lambda d: f"{len(d)}B")
def test_tricky_index_bytes_replay_through_the_harness(data: bytes) -> None:
    HARNESSES["decode_index"].fn(data)
    peak = _python_peak(decode_index, data)
    assert peak <= _PYTHON_ALLOCATION_BUDGET + 16 * len(data)


@pytest.mark.parametrize("name", ["encode_index", "block_id_layout", "block_id_set_ids"])
@pytest.mark.parametrize("data", TRICKY_FDP_BYTES, ids=lambda d: f"{d[:4].hex()}x{len(d)}")
def test_edge_bytes_replay_through_the_int_harnesses(name: str, data: bytes) -> None:
    HARNESSES[name].fn(data)


_I32, _I64 = 1 << 31, 1 << 63
TRICKY_LAYOUTS = [
    (0, 0, 0), (21, 20, 22), (31, 31, 1), (1, 31, 31), (32, 16, 15), (-1, 32, 32), (63, 0, 0),
    (_I32 - 1, -_I32 + 33, 31), (31, 31, 2),
]  # fmt: skip
TRICKY_IDS = [0, 1, -1, MAX_ID, -_I64, _I64, 1 << 64, -(1 << 64), 0x0000140000C00009]


@pytest.mark.parametrize("widths", TRICKY_LAYOUTS, ids=str)
def test_tricky_layouts_and_block_ids_replay_through_the_check(widths: tuple[int, int, int]) -> None:
    for block_id in TRICKY_IDS:
        for wanted in [(0, 0, 0), (5, 3, 9), (-1, 0, 0), (0, _I32, 0), (1 << 31, 0, 0), (0, 0, MAX_ID)]:
            check_block_id_layout(widths, block_id, wanted)


@pytest.mark.parametrize(
    "ids",
    [[], [-1], [MAX_ID], [_I64], [1 << 64], [-_I64], [0] * 17, [*range(20), -1], [_I64] * 20,
     [1 << 64, *range(20)], [MAX_ID, 0, *range(15)], [*range(16), 1 << 70]],
    ids=lambda ids: f"{len(ids)}ids",
)  # fmt: skip
def test_tricky_reported_ids_replay_through_the_check(ids: list[int]) -> None:
    for probe in (0, -1, MAX_ID, _I64, 1 << 64):
        check_reported_ids(ids, probe)


def _block(**fields: int) -> Block:
    values = {"block_id": 1, "length": 3, "uncompress_length": 3, "crc": 0, "task_attempt_id": 1}
    return Block(**(values | fields), data=b"abc")


@pytest.mark.parametrize(
    "entries, start, blocks",
    [
        ([IndexEntry(_I64, 0, 0, 0, 0, 0)], 0, [_block(uncompress_length=_I32)]),
        ([IndexEntry(-_I64 - 1, -_I32 - 1, _I32, 1 << 64, -1, 0)], -1, [_block(crc=1 << 64)]),
        ([IndexEntry(_I64 - 1, _I32 - 1, -_I32, -_I64, MAX_ID, 0)], _I64 - 3, [_block(), _block()]),
        ([], _I64 - 4, [_block(block_id=-_I64 - 1)]),
        ([], 0, [_block(task_attempt_id=_I64)]),
    ],
)
def test_tricky_index_fields_replay_through_the_check(
    entries: list[IndexEntry], start: int, blocks: list[Block]
) -> None:
    check_index_fields(entries, start, blocks)


_REDOS_BODIES = [b'{"appIdRegex": "(a+)+"}', b'{"appIdRegex": "(a|a)*$"}', b'{"appIdRegex": "' + b"(" * 600 + b'"}',
                 b'{"pageSize": 1e308}', b'{"currentPage": -1}', b'{"applications": [1, 2]}',
                 b'{"heartBeatStartTime": [1]}', b'{"appIdRegex": 5}']


@pytest.mark.parametrize("body", _REDOS_BODIES, ids=lambda b: b[:24].decode(errors="replace"))
def test_hostile_filters_replay_through_the_harness_quickly(body: bytes) -> None:
    started = time.monotonic()
    HARNESSES["applications_filter"].fn(body)
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("name", ["coordinator_heartbeat", "coordinator_app_request", "coordinator_assignment"])
@pytest.mark.parametrize("data", TRICKY_FDP_BYTES, ids=lambda d: f"{d[:4].hex()}x{len(d)}")
def test_edge_bytes_replay_through_the_coordinator_harnesses(name: str, data: bytes) -> None:
    HARNESSES[name].fn(data)
