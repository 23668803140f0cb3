"""valvey as one of a pair (issue 15): ``--check-config`` refuses an HA config whose CDU
watchdog would fire during a failover (its timeout not above lease + renewal + heartbeat
interval + request timeout) or is fed by any traffic, naming the keys; a single instance is
not checked; the pair's MQTT identity (client id, status topic and Will) is per instance while
a single instance keeps today's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.daemons import write_config
from rackplane.clock import SYSTEM_CLOCK
from rackplane.io.mqtt import MqttLink
from rackplane.settings import Identity, MqttSettings
from valvey.config import ValveyConfig, config_warnings

FAST = {"lease_s": 3.0, "renew_every_s": 0.5, "renew_deadline_s": 2.0, "retry_every_s": 0.2,
        "election_max_s": 1.0, "request_timeout_s": 0.5}


def test_a_single_instance_is_not_checked() -> None:
    cfg = ValveyConfig(cdu={"watchdog_timeout_s": 1.0, "watchdog_fed_by": "any_traffic"})
    assert not cfg.leadership.enabled


@pytest.mark.parametrize(("watchdog_s", "ok"), [(18.5, False), (18.6, True), (10.0, False)])
def test_the_watchdog_must_outlast_lease_renewal_heartbeat_and_timeout(
        watchdog_s: float, ok: bool) -> None:
    # defaults: lease 15 + renewal 2 + heartbeat 1 + cdu.timeout_s 0.5 = 18.5 s
    data = {"leadership": {"enabled": True}, "cdu": {"watchdog_timeout_s": watchdog_s}}
    if ok:
        assert ValveyConfig(**data).leadership.enabled
        return
    with pytest.raises(ValidationError) as err:
        ValveyConfig(**data)
    msg = str(err.value)
    for key in ("cdu.watchdog_timeout_s", "leadership.lease_s", "leadership.renew_every_s",
                "control.heartbeat_interval_s", "cdu.timeout_s", "= 18.5 s"):
        assert key in msg


def test_a_watchdog_fed_by_any_traffic_is_refused_for_a_pair() -> None:
    with pytest.raises(ValidationError, match=r"cdu\.watchdog_fed_by is 'any_traffic'"):
        ValveyConfig(leadership={"enabled": True, **FAST},
                     cdu={"watchdog_fed_by": "any_traffic"})


def test_a_pair_without_the_epoch_register_is_warned() -> None:
    cfg = ValveyConfig(leadership={"enabled": True, **FAST})
    assert any("points.controller_epoch is unset" in w for w in config_warnings(cfg))
    cfg = ValveyConfig(leadership={"enabled": True, **FAST},
                       points={"controller_epoch": "controller_epoch"})
    assert not any("controller_epoch" in w for w in config_warnings(cfg))


def test_check_config_exits_2_naming_the_keys(tmp_path: Path) -> None:
    bad = write_config(tmp_path / "bad.toml", leadership={"enabled": True},
                       spool={"directory": str(tmp_path / "spool")})
    good = write_config(tmp_path / "good.toml", identity={"site": "lab", "rack": "rack1"},
                        cdu={"port": 5020}, leadership={"enabled": True, **FAST},
                        points={"controller_epoch": "controller_epoch"},
                        spool={"directory": str(tmp_path / "spool")})
    for path, rc in ((bad, 2), (good, 0)):
        out = subprocess.run([sys.executable, "-m", "valvey", "--check-config", "--config",
                              str(path)], capture_output=True, text=True, timeout=60)
        assert out.returncode == rc, out.stdout + out.stderr
        if rc == 2:
            assert "cdu.watchdog_timeout_s" in out.stdout + out.stderr


async def test_the_mqtt_identity_is_per_instance_only_for_a_pair() -> None:
    ident = Identity(site="s1", rack="r1")
    one = MqttLink(MqttSettings(), ident, "valvey", clock=SYSTEM_CLOCK)
    assert one.client_id == "valvey-s1-r1"
    assert one.status_topic == "rackplane/s1/r1/valvey/status"
    assert "instance" not in one._status_payload("online", 1)
    b = MqttLink(MqttSettings(), ident, "valvey", clock=SYSTEM_CLOCK, instance="b")
    assert b.client_id == "valvey-s1-r1-b"
    assert b.status_topic == "rackplane/s1/r1/valvey/status/b"
    assert b._status_payload("offline", None)["instance"] == "b"
    assert b._make_client(0)._client._will_topic == b"rackplane/s1/r1/valvey/status/b"
    assert one._make_client(0)._client._will_topic == b"rackplane/s1/r1/valvey/status"
