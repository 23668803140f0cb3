"""tray-agent's pure core: clock-event decoding, counter rates that say when they cannot vouch,
the cap book (epoch, TTL -> safe cap, release -> default, clamping) and the contract payload
(racky's own decoder accepts it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rackplane.core.tray_contract import convert_tray
from trayagent.contract import SetPowerLimitsArgs
from trayagent.core.caps import CapBook, DeviceLimits, StaleEpoch
from trayagent.core.counters import CounterSpec, counter_rate
from trayagent.core.payload import GpuReading, NotPublishable, TrayInfo, tray_payload
from trayagent.core.throttle import decode_clock_events

LIM = DeviceLimits(200.0, 1200.0, 1000.0)


# --- clock-event reasons ---------------------------------------------------------------------

def test_every_known_bit_decodes_to_its_contract_name_in_bit_order() -> None:
    d = decode_clock_events(0x1FF)
    assert d.names == ["gpu_idle", "applications_clocks_setting", "sw_power_cap",
                       "hw_slowdown", "sync_boost", "sw_thermal_slowdown",
                       "hw_thermal_slowdown", "hw_power_brake_slowdown",
                       "display_clock_setting"]
    assert d.unknown_bits == 0
    assert decode_clock_events(0).names == []


@pytest.mark.parametrize("mask", [0x200, 0x10004, 1 << 63, 2**64 - 1])
def test_unknown_bits_are_returned_not_fatal(mask: int) -> None:
    d = decode_clock_events(mask)
    assert d.unknown_bits == mask & ~0x1FF
    assert ("sw_power_cap" in d.names) == bool(mask & 0x4)


@pytest.mark.parametrize("mask", [-1, 2**64, 1.0, True, "4", None])
def test_a_mask_that_is_not_an_unsigned_64_bit_integer_is_refused(mask: object) -> None:
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        decode_clock_events(mask)  # type: ignore[arg-type]


# --- counters -----------------------------------------------------------------------------------

SAT16 = CounterSpec(16, saturates=True)
SAT32_WORDS = CounterSpec(32, saturates=True, scale=4.0)  # port_xmit_data without extended
WRAP32 = CounterSpec(32, saturates=False)
WRAP64 = CounterSpec(64, saturates=False)


def test_a_rate_in_scaled_units_per_second() -> None:
    assert counter_rate(SAT32_WORDS, 100, 350, 2.0, 1e12) == (500.0, None)


@pytest.mark.parametrize(("spec", "prev", "cur", "dt", "reason"), [
    (SAT16, None, 5, 1.0, "missing"),
    (SAT16, 5, None, 1.0, "missing"),
    (SAT16, 5, 2**16, 1.0, "missing"),  # outside the width: not a reading of this counter
    (SAT16, -1, 5, 1.0, "missing"),
    (SAT16, 5, 6, 0.0, "no_time"),
    (SAT16, 5, 6, -1.0, "no_time"),
    (SAT16, 5, 2**16 - 1, 1.0, "saturated"),
    (SAT32_WORDS, 2**32 - 1, 2**32 - 1, 1.0, "saturated"),
    (SAT16, 500, 3, 1.0, "reset"),  # a saturating counter never wraps: cleared / reloaded
    (WRAP64, 10**12, 10, 1.0, "reset"),  # a 64-bit wrap after 1 s is implausible
    (WRAP32, 2**31, 5, 1.0, "reset"),  # 2**31 counts in 1 s above max_rate 1e6
])
def test_readings_that_cannot_vouch_give_an_unknown_rate_never_zero(
        spec: CounterSpec, prev: int | None, cur: int | None, dt: float, reason: str) -> None:
    assert counter_rate(spec, prev, cur, dt, 1e6) == (None, reason)


@pytest.mark.parametrize("spec", [SAT16, SAT32_WORDS, WRAP32, WRAP64])
def test_an_unchanged_counter_below_its_top_is_a_known_zero_rate(spec: CounterSpec) -> None:
    assert counter_rate(spec, 7, 7, 0.5, 1e6) == (0.0, None)
    assert counter_rate(spec, spec.top - 1, spec.top - 1, 0.5, 1e6) == (0.0, None)


@pytest.mark.parametrize("bits", [4, 8, 16, 32, 64])
def test_a_counter_specs_top_is_its_largest_value_and_not_part_of_its_identity(bits: int
                                                                              ) -> None:
    spec = CounterSpec(bits, saturates=False)
    assert spec.top == 2**bits - 1
    assert spec == CounterSpec(bits, saturates=False)
    assert "top" not in repr(spec)


def test_a_plausible_wrap_of_a_wrapping_counter_is_counted() -> None:
    assert counter_rate(WRAP32, 2**32 - 10, 5, 1.0, 1e6) == (15.0, None)


@pytest.mark.parametrize(("bits", "scale"), [(12, 1.0), (32, 0.0), (32, -4.0)])
def test_a_counter_spec_outside_the_documented_widths_is_refused(bits: int, scale: float
                                                                 ) -> None:
    with pytest.raises(ValueError):
        CounterSpec(bits, saturates=True, scale=scale)


# --- the cap book -------------------------------------------------------------------------------

def _book(**kw: object) -> CapBook:
    return CapBook({3: 4, 4: 4}, 700.0, **kw)  # type: ignore[arg-type]


def test_until_the_first_command_the_gpus_are_held_at_the_safe_cap() -> None:
    b = _book()
    assert [t.watts for t in b.targets(3, [LIM] * 4)] == [700.0] * 4
    assert {t.source for t in b.targets(3, [LIM] * 4)} == {"safe"}


def test_a_tray_cap_is_shared_and_the_gpu_cap_wins_when_lower() -> None:
    b = _book()
    b.apply([3], 5, power_cap_w=3200.0, ttl_s=60.0, now=0.0)
    assert [t.watts for t in b.targets(3, [LIM] * 4)] == [800.0] * 4
    b.apply([3], 5, gpu_power_cap_w=600.0, ttl_s=60.0, now=1.0)
    assert [(t.watts, t.source) for t in b.targets(3, [LIM] * 4)] == [(600.0, "racky")] * 4


def test_expiry_falls_back_to_the_safe_cap_never_uncapped() -> None:
    b = _book()
    b.apply([3], 5, power_cap_w=3200.0, ttl_s=60.0, now=0.0)
    assert b.expire(59.9) == []
    assert b.expires_in_s(3, 59.0) == pytest.approx(1.0)
    assert b.expire(60.0) == [3]
    c = b.trays[3]
    assert (c.power_cap_w, c.gpu_power_cap_w, b.expires_in_s(3, 61.0)) == (None, None, None)
    assert {(t.watts, t.source) for t in b.targets(3, [LIM] * 4)} == {(700.0, "safe")}
    assert b.expire(120.0) == []  # logged once


def test_a_release_is_racky_deciding_uncapped_the_device_default_applies() -> None:
    b = _book()
    b.apply([3], 5, power_cap_w=3200.0, ttl_s=60.0, now=0.0)
    b.apply([3], 5, release=["power_cap_w"], now=1.0)
    assert {(t.watts, t.source) for t in b.targets(3, [LIM] * 4)} == {(1000.0, "default")}
    assert b.expires_in_s(3, 2.0) is None
    unknown_default = DeviceLimits(200.0, 1200.0, None)
    t = b.targets(3, [unknown_default])[0]
    assert t.watts is None and t.clamped == "device default limit not known"


def test_targets_are_clamped_into_the_device_limits_and_say_so() -> None:
    b = CapBook({0: 1}, 100.0)
    t = b.targets(0, [LIM])[0]
    assert (t.watts, t.wanted_w) == (200.0, 100.0)
    assert "below the device minimum 200 W" in (t.clamped or "")
    b.apply([0], 1, gpu_power_cap_w=5000.0, ttl_s=60.0, now=0.0)
    t = b.targets(0, [LIM])[0]
    assert t.watts == 1200.0 and "above the device maximum 1200 W" in (t.clamped or "")


def test_epoch_zero_until_a_positive_epoch_is_seen_then_older_ones_are_refused() -> None:
    b = _book()
    assert b.apply([3], 0, gpu_power_cap_w=600.0, ttl_s=60.0, now=0.0)  # first: persist
    assert not b.apply([3], 0, gpu_power_cap_w=650.0, ttl_s=60.0, now=1.0)  # equal: applied
    assert b.trays[3].gpu_power_cap_w == 650.0
    assert b.apply([3], 7, gpu_power_cap_w=640.0, ttl_s=60.0, now=2.0)
    for old in (0, 6):
        with pytest.raises(StaleEpoch, match=f"epoch {old} older than 7"):
            b.apply([3, 4], old, gpu_power_cap_w=300.0, ttl_s=60.0, now=3.0)
    assert b.trays[3].gpu_power_cap_w == 640.0 and b.trays[4].epoch is None  # all or nothing


def test_persisted_epochs_are_enforced_after_a_restart() -> None:
    b = _book(epochs={3: 9})
    with pytest.raises(StaleEpoch):
        b.check_epoch([3], 8)
    b.check_epoch([4], 0)


def test_a_cap_without_ttl_changes_nothing() -> None:
    b = _book()
    with pytest.raises(ValueError, match="ttl_s"):
        b.apply([3], 1, power_cap_w=3000.0, now=0.0)
    assert b.trays[3].epoch is None and b.trays[3].held_safe


def test_an_unusable_safe_cap_is_refused() -> None:
    for bad in (0.0, -5.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="safe_gpu_cap_w"):
            CapBook({0: 1}, bad)


# --- the payload ---------------------------------------------------------------------------------

INFO = TrayInfo("lab", "row1", "rack01", 3, 150.0, 45.0)


def _gpu(g: int, **kw: object) -> GpuReading:
    base: dict[str, object] = dict(power_w=650.0, temp_c=70.0, reasons=["sw_power_cap"],
                                   utilization=0.9, limit_w=700.0, limits=LIM)
    base.update(kw)
    return GpuReading(gpu=g, **base)  # type: ignore[arg-type]


def test_the_payload_is_the_contract_racky_decodes() -> None:
    b = _book()
    b.apply([3], 11, gpu_power_cap_w=700.0, ttl_s=60.0, now=0.0)
    p = tray_payload(INFO, [_gpu(g) for g in range(12, 16)], b.trays[3], ts_ns=10**18,
                     cap_expires_in_s=b.expires_in_s(3, 1.0))
    m = convert_tray(json.loads(json.dumps(p))).struct
    assert m.power_w == 4 * 650.0 + 150.0
    assert (m.agent.enforced_gpu_cap_w, m.agent.enforced_tray_cap_w) == (700.0, 2800.0)
    assert (m.agent.gpu_power_cap_w, m.agent.epoch, m.agent.capping) == (700.0, 11, True)
    assert m.agent.cap_expires_in_s == 59.0
    assert m.leak_sensor_fault and not m.leak
    g = m.gpus[0]
    assert (g.power_limit_w, g.power_limit_min_w, g.power_limit_max_w,
            g.power_limit_default_w, g.power_kind) == (700.0, 200.0, 1200.0, 1000.0, "average")
    assert (m.agent.cap_enforceable, m.agent.cap_clamped) == (True, None)
    assert m.schema_version == "1.3"


def test_a_1_0_message_is_still_read_and_a_newer_minor_is_read_leniently() -> None:
    p = tray_payload(INFO, [_gpu(12)], _book().trays[3], ts_ns=1, cap_expires_in_s=None,
                     cap_enforceable=False)
    old = json.loads(json.dumps(p))
    old["schema_version"] = "1.0"  # a 1.0 agent (the simulator's before 1.1) is still read
    for k in ("cap_enforceable", "cap_clamped"):
        del old["agent"][k]
    for k in ("power_kind", "energy_mj", "power_limit_w", "power_limit_min_w",
              "power_limit_max_w", "power_limit_default_w"):
        del old["gpus"][0][k]
    m = convert_tray(old).struct
    assert m.agent.cap_enforceable is None and m.gpus[0].power_limit_min_w is None
    newer = json.loads(json.dumps(p))
    newer["schema_version"] = "1.7"
    newer["agent"]["bmc_mode"] = "x"
    d = convert_tray(newer)
    assert d.ignored == frozenset({"agent.bmc_mode"}) and d.struct.agent.cap_enforceable is False


@pytest.mark.parametrize(("kw", "why"), [
    ({"power_w": None, "errors": {"power_w": "GPU is lost"}}, "power unknown (GPU is lost)"),
    ({"power_w": float("nan")}, "power unknown"),
    ({"power_w": -1.0}, "power unknown"),
    ({"limit_w": None}, "enforced power limit unknown"),
])
def test_a_gpu_without_power_or_enforced_limit_makes_the_tray_unpublishable(
        kw: dict[str, object], why: str) -> None:
    gpus = [_gpu(12), _gpu(13, **kw)]
    with pytest.raises(NotPublishable, match=re.escape(f"gpu 13: {why}")):
        tray_payload(INFO, gpus, _book().trays[3], ts_ns=1, cap_expires_in_s=None)


def test_unknown_figures_are_null_and_utilization_is_kept_in_0_1() -> None:
    p = tray_payload(INFO, [_gpu(12, temp_c=None, utilization=1.7)], _book().trays[3],
                     ts_ns=1, cap_expires_in_s=None)
    g = p["gpus"][0]
    assert (g["temp_c"], g["utilization"], g["t_limit_c"]) == (None, 1.0, None)


def test_the_args_model_is_the_simulators_contract_model() -> None:
    from sims.telemetry import SetPowerLimitsArgs as SimArgs

    a = SetPowerLimitsArgs.model_json_schema()
    b = SimArgs.model_json_schema()
    for k in ("title", "description"):
        a.pop(k)
        b.pop(k)
    assert a == b


def test_a_damaged_epoch_file_stops_the_start_rather_than_accept_old_commands(
        tmp_path: Path) -> None:
    from rackplane.errors import ConfigError
    from trayagent.app import TrayAgent
    from trayagent.config import TrayAgentConfig

    folder = tmp_path
    epochs = folder / "epochs.json"
    cfg = TrayAgentConfig.model_validate({
        "spool": {"directory": str(folder / "spool")},
        "caps": {"epoch_file": str(epochs)},
        "agents": {"trays": [{"tray": 3, "nvml_devices": [0, 1, 2, 3],
                              "coolant_out_temp_c": 45.0}]}})
    epochs.write_text('{"format": "tray-agent-epochs", "version": 1, "saved_wall_ns": 1, '
                      '"data": {"epochs": {"3": 1764599990123, "9": 5}}}')
    agent = TrayAgent(cfg)
    assert agent.book.trays[3].epoch == 1764599990123  # tray 9 is not hosted: dropped
    epochs.write_text("{not json")
    with pytest.raises(ConfigError, match=r"caps\.epoch_file"):
        TrayAgent(cfg)


async def test_an_epoch_that_cannot_be_persisted_is_applied_and_said(tmp_path: Path) -> None:
    from rackplane.core.envelope import CommandContext
    from trayagent.app import TrayAgent
    from trayagent.config import TrayAgentConfig
    from trayagent.contract import SetPowerLimitsArgs

    cfg = TrayAgentConfig.model_validate({
        "spool": {"directory": str(tmp_path / "spool")},
        "caps": {"epoch_file": str(tmp_path / "gone" / "epochs.json"), "dry_run": True,
                 "confirm_timeout_s": 0.1},
        "agents": {"trays": [{"tray": 3, "nvml_devices": [0, 1, 2, 3],
                              "coolant_out_temp_c": 45.0}]}})
    agent = TrayAgent(cfg)
    args = SetPowerLimitsArgs.model_validate({"schema_version": "1.1", "trays": [3],
                                              "epoch": 9, "gpu_power_cap_w": 500.0,
                                              "ttl_s": 60.0})
    ctx = CommandContext(user="racky", role="automation", verb="set_power_limits",
                         request_id="r", issued_at_ns=0, now_mono=0.0, wall_ns=0,
                         received_mono=0.0)
    state = await agent._set_power_limits(args, ctx)
    assert state["epoch_persisted"] is False and state["confirmed"] is False
    assert agent.book.trays[3].epoch == 9


def test_check_config_refuses_an_epoch_file_in_a_missing_folder(tmp_path: Path) -> None:
    from rackplane.errors import ConfigError
    from trayagent.app import load_tray_agent_config

    cfg = tmp_path / "t.toml"
    needed = ('[identity]\nsite = "lab"\nrack = "rack1"\n[[agents.trays]]\ntray = 0\n'
              'nvml_devices = [0, 1, 2, 3]\ncoolant_out_temp_c = 45.0\n')  # what it must name
    cfg.write_text(f'{needed}[caps]\nepoch_file = "{tmp_path / "missing" / "e.json"}"\n')
    with pytest.raises(ConfigError, match=r"caps\.epoch_file: .* does not exist"):
        load_tray_agent_config(cfg)
    cfg.write_text(f'{needed}[caps]\nepoch_file = "{tmp_path / "e.json"}"\n')
    assert load_tray_agent_config(cfg).caps.epoch_file == tmp_path / "e.json"
