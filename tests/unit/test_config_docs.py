"""The example configs are generated from the models, and every shipped config file loads."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from riffle_actors.config import load_config
from riffle_actors.coordinator.config import load_coordinator_config

REPO = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_config_docs", REPO / "scripts" / "gen_config_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_configs_match_the_models():
    for path, text in _generator().targets():
        assert path.read_text() == text, f"{path.name} is stale: run python scripts/gen_config_docs.py"


@pytest.mark.parametrize("name", ["server.toml", "server.example.toml"])
def test_shipped_server_configs_load(name):
    load_config(REPO / "config" / name)


@pytest.mark.parametrize("name", ["coordinator.toml", "coordinator.example.toml"])
def test_shipped_coordinator_configs_load(name):
    load_coordinator_config(REPO / "config" / name)
