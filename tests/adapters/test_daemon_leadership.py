"""The daemon frame's leadership (issue 15): a single-instance config writes as before; two
instances of a pair on a real 3-node NATS cluster → exactly one may write, the other's Modbus
writes are refused with WriteFenced before anything is sent; a clean stop releases the lease
and the other instance takes over without waiting for it to expire. And the ``[leadership]``
settings' validation."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field, ValidationError

from harness.servers import NatsCluster
from rackplane.clock import SYSTEM_CLOCK
from rackplane.core.registers import parse_register_map
from rackplane.errors import ModbusConnectionError, WriteFenced
from rackplane.io.modbus import ModbusDevice
from rackplane.leadership_settings import LeadershipSettings
from rackplane.settings import ModbusTargetSettings
from tests.adapters.test_nats_lease import wait_until
from tests.unit.test_daemon_frame import FakeConfig, RecordingNotifier, Tiny, _cfg

_n = itertools.count()
FAST = {"lease_s": 3.0, "renew_every_s": 0.5, "renew_deadline_s": 2.0, "retry_every_s": 0.2,
        "election_max_s": 1.0, "request_timeout_s": 0.5}


class PairConfig(FakeConfig):
    leadership: LeadershipSettings = Field(default_factory=LeadershipSettings)


class PairTiny(Tiny):
    """Tiny with one Modbus owner (never started: its writes show the gate)."""

    def __init__(self, cfg: Any, events: list[str], **kw: Any) -> None:
        super().__init__(cfg, events, **kw)
        regmap = parse_register_map({"device": {"name": "t"}, "points": [
            {"name": "valve_command_pct", "table": "holding", "address": 0, "type": "uint16",
             "writable": True, "write_min": 0.0, "write_max": 100.0}]})
        target = ModbusTargetSettings.model_validate({
            "name": "cdu", "host": "127.0.0.1", "port": 1, "unit_id": 1,
            "register_map": "test-map"})
        self.device = ModbusDevice(target, regmap, clock=SYSTEM_CLOCK, on_samples=lambda s: None)

    def modbus_devices(self) -> list[ModbusDevice]:
        return [self.device]


def test_single_instance_may_always_write(tmp_path: Path) -> None:
    for cfg in (_cfg(tmp_path), PairConfig(**_cfg(tmp_path).model_dump())):
        d = Tiny(cfg, [], notifier=RecordingNotifier())  # type: ignore[arg-type]
        assert d.leadership_settings() is None
        assert d.may_write(SYSTEM_CLOCK.monotonic())
        assert d.controller_epoch == 0


async def test_a_pair_one_writer_the_other_fenced_then_a_clean_stop_hands_over(
    tmp_path: Path, nats_cluster: NatsCluster,
) -> None:
    bucket = f"pair{next(_n)}"
    daemons, stops, tasks = [], [], []
    for inst in "ab":
        base = _cfg(tmp_path / inst).model_dump()
        cfg = PairConfig(**base, leadership=LeadershipSettings(
            enabled=True, instance=inst, servers=nats_cluster.urls, bucket=bucket, **FAST))
        d = PairTiny(cfg, [], notifier=RecordingNotifier())
        stop = asyncio.Event()
        daemons.append(d)
        stops.append(stop)
        tasks.append(asyncio.create_task(d.run(stop)))
    try:
        await wait_until(lambda now: any(d.may_write(now) for d in daemons))
        now = SYSTEM_CLOCK.monotonic()
        assert sum(d.may_write(now) for d in daemons) == 1
        active = next(d for d in daemons if d.may_write(now))
        standby = next(d for d in daemons if d is not active)
        assert active.controller_epoch > 0 and standby.controller_epoch == 0
        with pytest.raises(WriteFenced, match="does not hold the leadership lease"):
            await standby.device.write("valve_command_pct", 50.0)
        with pytest.raises(ModbusConnectionError):  # past the gate: the (unstarted) device
            await active.device.write("valve_command_pct", 50.0)
        epoch = active.controller_epoch
        stops[daemons.index(active)].set()
        await tasks[daemons.index(active)]
        stopped_at = SYSTEM_CLOCK.monotonic()
        assert not active.may_write(stopped_at)
        took_over = await wait_until(standby.may_write, timeout_s=30)
        assert took_over < stopped_at + FAST["lease_s"]  # released: no waiting for expiry
        assert standby.controller_epoch > epoch
    finally:
        for s in stops:
            s.set()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize(("kw", "named"), [
    ({"renew_deadline_s": 20.0}, "must be < lease_s"),
    ({"renew_deadline_s": 8.0}, "election_max_s"),
    ({"request_timeout_s": 3.0}, "request_timeout_s"),
    ({"servers": ["127.0.0.1:4222"]}, "nats://host:port"),
    ({"servers": []}, "at least 1"),
    ({"instance": "A B"}, "pattern"),
    ({"lease_s": float("nan")}, "finite"),
])
def test_leadership_settings_refuse_bad_values(kw: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        LeadershipSettings(**kw)
    assert LeadershipSettings().timing().renew_deadline_s == 10.0
