"""The shipped example configs are what the models generate, and they load."""

from __future__ import annotations

from pathlib import Path

import pytest

from rackplane.config import example_toml, load_config
from racky.config import RackyConfig
from valvey.config import ValveyConfig

CONFIG = Path(__file__).resolve().parents[2] / "config"


@pytest.mark.parametrize(("model", "file", "title"), [
    (ValveyConfig, "valvey.example.toml", "valvey configuration (valvey --config FILE)"),
    (RackyConfig, "racky.example.toml", "racky configuration (racky --config FILE)"),
])
def test_example_is_generated_and_loads(model: type, file: str, title: str) -> None:
    path = CONFIG / file
    assert path.read_text() == example_toml(model, title), (
        f"{file} is stale: regenerate with `{file.split('.')[0]} --print-default-config > "
        f"config/{file}`"
    )
    loaded = load_config(model, path).model_dump()
    defaults = model().model_dump()
    # The only difference: relative paths resolve against the config file's folder.
    assert loaded["spool"].pop("directory") == (CONFIG / "spool").resolve()
    defaults["spool"].pop("directory")
    assert loaded == defaults
