"""``tune_malloc``: glibc accepts every setting, and an operator's MALLOC_* variable turns it off."""

from __future__ import annotations

import subprocess
import sys

from riffle_actors.io.malloc import SETTINGS, tune_malloc


def test_every_setting_is_accepted_by_glibc():
    # in a child process: the settings stay for the life of the process that applies them
    code = "from riffle_actors.io.malloc import tune_malloc; print(sorted(tune_malloc({})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == str(sorted(name for name, _, _ in SETTINGS))


def test_an_operator_setting_leaves_malloc_alone():
    assert tune_malloc({"MALLOC_TRIM_THRESHOLD_": "0"}) == {}
