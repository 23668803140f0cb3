"""The shipped example configs are what the models generate, and they load."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from rackplane.config import example_toml, load_config
from rackplane.errors import ConfigError
from racky.config import RackyConfig
from rlc.config import RlcConfig
from tests.unit.config_examples import uncomment_required
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
def test_example_is_generated_and_loads(model: type[BaseModel], file: str, title: str,
                                        tmp_path: Path) -> None:
    path = CONFIG / file
    assert path.read_text() == example_toml(model, title), (
        f"{file} is stale: regenerate with `{file.split('.')[0]} --print-default-config > "
        f"config/{file}`"
    )
    hook = getattr(model, "example_values", None)
    if any(f.is_required() for f in model.model_fields.values()):
        # required sections, written commented out: the file alone is refused
        with pytest.raises(ConfigError, match=r"no \[topology\] section.*rlc\.example\.toml"):
            load_config(model, path)
        path = tmp_path / file
        path.write_text(uncomment_required(CONFIG.joinpath(file).read_text()))
    loaded = load_config(model, path).model_dump()
    defaults = model.model_validate(hook() if hook is not None else {}).model_dump()
    # spool.directory is unset: a folder per daemon and rack (rackplane.settings).
    assert loaded["spool"]["directory"] is None
    assert loaded == defaults
