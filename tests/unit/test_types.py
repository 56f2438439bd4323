"""The type check of ``[tool.mypy]`` (pyproject.toml) passes: run mypy over ``riffle_actors``.

Strict on the packages everything else stands on (``runtime``, ``state``, ``protocol``: every
function annotated, no bare generics, no ``Any`` returned as a typed value), the default checks
elsewhere with the bodies of unannotated functions checked too. The last test shows the check can
fail: the same configuration refuses an unannotated function in a strict package.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STRICT = {"riffle_actors.runtime.*", "riffle_actors.state.*", "riffle_actors.protocol.*"}


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)


def test_mypy_finds_no_error_in_riffle_actors():
    proc = _mypy()
    assert proc.returncode == 0, f"mypy failed:\n{proc.stdout}\n{proc.stderr}"
    assert "Success: no issues found" in proc.stdout, proc.stdout


def test_the_foundation_packages_are_checked_strictly():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    [strict] = [o for o in cfg["overrides"] if set(o["module"]) == STRICT]
    for flag in ("disallow_untyped_defs", "disallow_any_generics", "warn_return_any", "disallow_untyped_calls"):
        assert strict.get(flag) is True, flag
    assert cfg["files"] == ["riffle_actors"]


def test_the_check_fails_on_an_unannotated_function_in_a_strict_package(tmp_path):
    probe = ROOT / "riffle_actors" / "state" / "_mypy_probe.py"
    probe.write_text("def half(x):\n    return x / 2\n")
    try:
        proc = _mypy(str(probe))
    finally:
        probe.unlink()
    assert proc.returncode == 1, proc.stdout
    assert "Function is missing a type annotation" in proc.stdout, proc.stdout
