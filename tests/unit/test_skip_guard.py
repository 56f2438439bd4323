"""The ``RIFFLE_TESTS_REQUIRE_ALL`` guard of ``tests/conftest.py``, both ways, on a real pytest run.

A skip inside a test and a skip while a module is collected (``pytest.importorskip`` of a missing
module at module level) must both fail the run under ``RIFFLE_TESTS_REQUIRE_ALL=1``, and both stay
plain skips without it. The probe modules are written under ``tests/`` (so the real conftest applies)
in a throwaway package that is removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBES = {
    "test_skip_at_collection.py": 'import pytest\npytest.importorskip("riffle_no_such_module")\n\n'
                                  "def test_never_collected():\n    pass\n",
    "test_skip_in_test.py": 'import pytest\n\ndef test_skips():\n    pytest.skip("no prerequisite")\n',
}


@pytest.fixture
def probe_dir() -> Iterator[Path]:
    directory = REPO / "tests" / f"_skip_guard_{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    try:
        (directory / "__init__.py").write_text("")
        for name, text in PROBES.items():
            (directory / name).write_text(text)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _run(target: Path, require_all: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RIFFLE_TESTS_REQUIRE_ALL"}
    if require_all:
        env["RIFFLE_TESTS_REQUIRE_ALL"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           str(target)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_a_skip_fails_the_run_under_require_all(probe_dir: Path, probe: str) -> None:
    result = _run(probe_dir / probe, require_all=True)
    assert result.returncode in (1, 2), result.stdout[-2000:]  # 2: a collection error interrupts the run
    assert "RIFFLE_TESTS_REQUIRE_ALL=1 requires every test to run" in result.stdout, result.stdout[-2000:]


def test_a_skip_stays_a_skip_without_require_all(probe_dir: Path) -> None:
    result = _run(probe_dir, require_all=False)  # both probes in one run: a lone collection skip exits 5
    assert result.returncode == 0, result.stdout[-2000:]
    assert "2 skipped" in result.stdout and "failed" not in result.stdout, result.stdout[-2000:]
