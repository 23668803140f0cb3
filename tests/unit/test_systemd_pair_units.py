"""The pairs' template units systemd/valvey@.service and systemd/racky@.service (issue 15
item 5): each verifies, keeps its single-instance unit's hardening and contract line for line,
differs only where an instance must (config, secrets, state directory, the conflict with the
single instance).

The single-instance units (valvey.service, racky.service) stay the default;
`test_systemd_units.py` checks them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_systemd_units import ANALYZE, DAEMONS, UNITS, exposure, needs_analyze

WHAT = {"valvey": "CDU cooling controller", "racky": "rack power and infrastructure manager"}


def instance_keys(daemon: str) -> dict[str, list[str]]:
    """Keys whose values differ between <daemon>.service and <daemon>@.service, with the
    template's."""
    return {
        "Description": [f"rackplane {daemon} %i: {WHAT[daemon]}, one instance of an "
                        "active/standby pair"],
        "Conflicts": [f"{daemon}.service"],
        "ExecStart": [f"/opt/rackplane/bin/{daemon} --config /etc/rackplane/{daemon}-%i.toml"],
        "EnvironmentFile": [f"-/etc/rackplane/{daemon}.env",
                            f"-/etc/rackplane/{daemon}-%i.env"],
        "StateDirectory": [f"rackplane-{daemon}-%i"],
    }


def _directives(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.mark.parametrize("daemon", DAEMONS)
def test_template_equals_single_unit_but_for_the_instance(daemon: str) -> None:
    single = _directives(UNITS / f"{daemon}.service")
    pair = _directives(UNITS / f"{daemon}@.service")
    for key, values in instance_keys(daemon).items():
        assert pair.pop(key) == values, key
        single.pop(key, None)
    # Hardening, watchdog, restart, stop timeout, user: identical, in the same order.
    assert pair == single


def _instance_copy(tmp_path: Path, daemon: str, instance: str) -> Path:
    exe = Path(sys.executable).parent / daemon
    assert exe.exists(), f"console script {exe} missing: is the project installed (make venv)?"
    text = (UNITS / f"{daemon}@.service").read_text()
    dst = tmp_path / f"{daemon}@{instance}.service"
    dst.write_text(text.replace(f"/opt/rackplane/bin/{daemon} ", f"{exe} "))
    return dst


@needs_analyze
@pytest.mark.parametrize("daemon", DAEMONS)
@pytest.mark.parametrize("instance", ["a", "b"])
def test_template_instance_verifies(daemon: str, instance: str, tmp_path: Path) -> None:
    assert ANALYZE is not None
    unit = _instance_copy(tmp_path, daemon, instance)
    res = subprocess.run([ANALYZE, "verify", "--man=no", str(unit)],
                         capture_output=True, text=True, timeout=60)
    ours = [ln for ln in (res.stdout + res.stderr).splitlines() if unit.name in ln]
    assert res.returncode == 0 and not ours, res.stdout + res.stderr


@needs_analyze
@pytest.mark.parametrize("daemon", DAEMONS)
def test_template_exposure_same_as_single(daemon: str, tmp_path: Path) -> None:
    pair = exposure(_instance_copy(tmp_path, daemon, "a"))
    exe = Path(sys.executable).parent / daemon
    single_unit = tmp_path / f"{daemon}.service"
    single_unit.write_text((UNITS / f"{daemon}.service").read_text()
                           .replace(f"/opt/rackplane/bin/{daemon} ", f"{exe} "))
    assert pair <= 2.0
    assert pair == exposure(single_unit)


@pytest.mark.parametrize("daemon", DAEMONS)
def test_template_has_the_same_real_time_drop_in(daemon: str) -> None:
    single = UNITS / f"{daemon}.service.d" / "10-realtime.conf"
    pair = UNITS / f"{daemon}@.service.d" / "10-realtime.conf"
    assert pair.read_text() == single.read_text()
