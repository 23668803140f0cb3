"""The shipped example configs are what the models generate, and they load."""

from __future__ import annotations

from pathlib import Path

import pytest

from rackplane.config import example_toml, load_config
from racky.config import RackyConfig
from rlc.config import RlcConfig
from trayagent.config import TrayAgentConfig
from valvey.config import ValveyConfig

CONFIG = Path(__file__).resolve().parents[2] / "config"


@pytest.mark.parametrize(("model", "file", "title"), [
    (ValveyConfig, "valvey.example.toml", "valvey configuration (valvey --config FILE)"),
    (RackyConfig, "racky.example.toml", "racky configuration (racky --config FILE)"),
    (TrayAgentConfig, "tray-agent.example.toml",
     "tray-agent configuration (tray-agent --config FILE)"),
    (RlcConfig, "rlc.example.toml", "rlc configuration (rlc --config FILE)"),
])
def test_example_is_generated_and_loads(model: type, file: str, title: str) -> None:
    path = CONFIG / file
    assert path.read_text() == example_toml(model, title), (
        f"{file} is stale: regenerate with `{file.split('.')[0]} --print-default-config > "
        f"config/{file}`"
    )
    loaded = load_config(model, path).model_dump()
    defaults = model().model_dump()
    # spool.directory is unset: a folder per daemon and rack (rackplane.settings).
    assert loaded["spool"]["directory"] is None
    assert loaded == defaults
