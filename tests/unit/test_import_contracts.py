"""The import contracts of ``[tool.importlinter]`` (pyproject.toml) hold: run ``lint-imports``.

The contracts make the layers visible and enforced: entry points -> composition roots ->
transport adapters -> services -> actors -> state -> io -> shared kernel -> protocol and runtime;
the runtime and the protocol codecs import nothing else of ``riffle_actors``; no import cycles
among actor modules. Imports inside functions and under ``TYPE_CHECKING`` count.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import riffle_actors

ROOT = Path(__file__).resolve().parents[2]


def _contracts() -> dict[str, dict]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert "exclude_type_checking_imports" not in cfg  # TYPE_CHECKING imports must count
    return {c["id"]: c for c in cfg["contracts"]}


def test_lint_imports_keeps_every_contract():
    script = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    proc = subprocess.run([sys.executable, "-c", script, "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, f"lint-imports failed:\n{proc.stdout}\n{proc.stderr}"
    assert "0 broken" in proc.stdout, proc.stdout


def test_every_top_level_module_is_in_a_layer_and_in_the_independence_contracts():
    """A new module of ``riffle_actors`` must be placed in a layer (and named in the forbidden lists
    of the runtime and protocol contracts), or the contracts would not look at it."""
    contracts = _contracts()
    top = {f"riffle_actors.{m.name}" for m in pkgutil.iter_modules(riffle_actors.__path__)}
    layered = {name.strip().split(".")[0] + "." + name.strip().split(".")[1]
               for layer in contracts["layers"]["layers"] for name in layer.replace(":", "|").split("|")}
    assert top <= layered, f"not in any layer: {sorted(top - layered)}"
    # the protocol codecs may use the one module below them, the block record they decode into
    for cid, allowed in (("runtime-independent", {"riffle_actors.runtime"}),
                         ("protocol-independent", {"riffle_actors.protocol", "riffle_actors.records"})):
        forbidden = set(contracts[cid]["forbidden_modules"])
        assert forbidden == top - allowed, f"{cid}: missing {sorted(top - allowed - forbidden)}"
