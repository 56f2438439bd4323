"""Every test module has a basename of its own: the test directories are not packages, so pytest
imports ``tests/a/test_x.py`` and ``tests/b/test_x.py`` under one name and refuses the second at
collection ("import file mismatch"), which stops the whole run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_basename():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [n for n, c in names.items() if c > 1], sorted(
        str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py") if names[p.name] > 1)
