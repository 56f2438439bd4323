"""``RIFFLE_TESTS_REQUIRE_ALL=1`` (set by ``.ci/run``) turns a skipped test into a failure naming the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, require_all: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_needs_java.py").write_text(
        "import pytest\n\ndef test_needs_java():\n    pytest.skip('java is not on PATH')\n\n"
        "def test_plain():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RIFFLE_TESTS_REQUIRE_ALL", None)
    if require_all:
        env["RIFFLE_TESTS_REQUIRE_ALL"] = "1"
    # our conftest's hook, loaded as a plugin into a session on a test file outside the suite
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-q", "-rs", "-p",
                           "no:cacheprovider", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_skip_fails_the_run_when_every_test_is_required(tmp_path: Path):
    result = _run(tmp_path, require_all=True)
    assert result.returncode == 1, result.stdout
    assert "1 failed, 1 passed" in result.stdout
    assert "java is not on PATH" in result.stdout and "RIFFLE_TESTS_REQUIRE_ALL=1" in result.stdout


def test_a_skip_is_listed_otherwise(tmp_path: Path):
    result = _run(tmp_path, require_all=False)
    assert result.returncode == 0, result.stdout
    assert "SKIPPED [1]" in result.stdout and "java is not on PATH" in result.stdout
