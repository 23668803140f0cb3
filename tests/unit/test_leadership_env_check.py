"""``--check-config`` names an unset ``[leadership] password_env`` (valvey, racky, rlc) as it
does ``mqtt.password_env``: the loaders used to say OK, and the instance then retried its NATS
connection for ever (an empty password) and never took part in its pair. rlc's loader now
checks ``mqtt.password_env`` too (it checked no env var at all). Not checked while the pair
is off."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rackplane.config import ConfigError
from racky.app import load_racky_config
from rlc.app import load_rlc_config
from valvey.app import load_valvey_config

VAR = "RACKPLANE_TEST_UNSET_NATS_PW"
RLC_TOPOLOGY = ('[topology]\nsite = "lab"\nhalls = {h1 = {feed_limit_w = 1e6, rows = {r1 = {'
                'limit_w = 1e5, racks = {rack1 = {floor_w = 1e4, max_w = 5e4}}}}}}\n')
LOADERS: list[tuple[str, Callable[[Path], Any], str]] = [
    ("valvey", load_valvey_config, "[cdu]\nport = 5020\nwatchdog_timeout_s = 30\n"),
    ("racky", load_racky_config, ""),
    ("rlc", load_rlc_config, RLC_TOPOLOGY),
]


def _write(tmp_path: Path, extra: str, body: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(f'{extra}[identity]\nsite = "lab"\nrack = "rack1"\n'
                 f'[spool]\ndirectory = "{tmp_path / "spool"}"\n{body}')
    return p


@pytest.mark.parametrize(("name", "load", "extra"), LOADERS)
def test_an_unset_leadership_password_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               name: str, load: Callable[[Path], Any],
                                               extra: str) -> None:
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    pair = f'[leadership]\nenabled = true\nusername = "{name}"\npassword_env = "{VAR}"\n'
    with pytest.raises(ConfigError, match=rf"leadership\.password_env: environment variable "
                       rf"{VAR} is not set"):
        load(_write(tmp_path, extra, pair))
    monkeypatch.setenv(VAR, "pw")
    assert load(_write(tmp_path, extra, pair)) is not None
    monkeypatch.delenv(VAR)
    off = pair.replace("enabled = true", "enabled = false")
    assert load(_write(tmp_path, extra, off)) is not None     # a single instance: not checked


def test_rlc_checks_its_mqtt_password_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=rf"mqtt\.password_env: environment variable {VAR}"):
        load_rlc_config(_write(tmp_path, RLC_TOPOLOGY, f'[mqtt]\npassword_env = "{VAR}"\n'))
