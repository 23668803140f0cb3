"""The overheat alarms' cooling text states what racky knows of the cooling (racky/core/
thermal.py): valvey's state and its age, its figures and its active alarms. After a pump trip
``rack_overheat`` used to say "cause: rack-wide (cooling normal: supply 45.0 °C, setpoint
45.0 °C)": the supply had not risen yet and valvey's alarms were not read; and a stale or
missing state was called "no current cooling state" without its age."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Sequence

import numpy as np

from racky.config import CoolingSettings, RackyConfig, ThermalSettings
from racky.core.controller import RackyCore
from racky.core.lifecycle import Lifecycle, PersistedState
from racky.core.thermal import CoolingReading, ThermalInputs, ThermalWatch
from racky.tick import RackyTick
from valvey.config import ValveyConfig
from valvey.core.alarm_defs import alarm_defs

TRAYS, GPT = 4, 4
NORMAL = re.compile(r"\bnormal\b")  # not "abnormal"


def _watch() -> ThermalWatch:
    return ThermalWatch(ThermalSettings(many_trays=3), CoolingSettings(), TRAYS, GPT,
                        tgp_w=1200.0, min_cap_w=200.0)


def _inputs(cool: CoolingReading | None, hot_trays: int) -> ThermalInputs:
    n = TRAYS * GPT
    margin = np.full(n, 20.0)
    margin[: hot_trays * GPT] = 0.5  # below the 2 K warning margin
    return ThermalInputs(
        gpu_temp_c=np.full(n, 80.0), gpu_t_limit_c=margin, gpu_power_w=np.full(n, 1000.0),
        gpu_throttled=np.zeros(n, dtype=bool), gpu_fresh=np.ones(n, dtype=bool),
        tray_outlet_c=np.full(TRAYS, 50.0), tray_fresh=np.ones(TRAYS, dtype=bool),
        psu_temp_c={}, cooling=cool)


def _rack_overheat(cool_at: Sequence[CoolingReading | None], t_end: float = 10.0) -> str:
    w = _watch()
    detail = ""
    for i in range(int(t_end) + 1):
        now = 100.0 + i
        c = cool_at[min(i, len(cool_at) - 1)]
        step = w.step(now, _inputs(c, hot_trays=3))
        detail = step.details.get("rack_overheat", {}).get("", detail)
    assert detail, "three hot trays must raise rack_overheat"
    return detail


def _valvey(t: float, alarms: tuple[str, ...] | None) -> CoolingReading:
    return CoolingReading(t_mono=t, supply_temp_c=45.0, setpoint_c=45.0, flow_lpm=None,
                          alarms=alarms)


def test_after_a_pump_trip_the_cause_is_the_cooling_and_the_faults_are_named() -> None:
    # the supply has not risen yet; valvey's state lists the trip
    cool = [_valvey(100.0 + i, ("pump_a_fault", "pump_failover", "filter_dp_high"))
            for i in range(11)]
    text = _rack_overheat(cool)
    assert "cause: cooling (cooling abnormal" in text and not NORMAL.search(text), text
    assert "valvey faults active: pump_a_fault, pump_failover" in text, text
    assert "other valvey alarms: filter_dp_high" in text, text
    assert "per valvey's state 0 s old" in text and "flow not reported" in text, text


def test_a_stale_or_missing_valvey_state_is_never_called_normal() -> None:
    stale = _rack_overheat([_valvey(60.0, ())])  # last heard 40-50 s before the alarm
    assert not NORMAL.search(stale), stale
    assert "cause: unknown (cooling unknown: valvey's state is" in stale, stale
    assert "s old (stale after 15 s); last: supply 45.0 °C" in stale, stale
    missing = _rack_overheat([None])
    assert not NORMAL.search(missing) and "no state from valvey received" in missing, missing


def test_fresh_quiet_cooling_is_normal_with_its_age_and_figures() -> None:
    text = _rack_overheat([_valvey(100.0 + i, ()) for i in range(11)])
    assert "cause: rack-wide (cooling normal per valvey's state 0 s old: supply 45.0 °C, " \
           "setpoint 45.0 °C, flow not reported; no valvey alarm active)" in text, text


def test_racky_reads_valveys_alarms_from_its_state() -> None:
    cfg = RackyConfig()
    tick = RackyTick(cfg, RackyCore(cfg, 0.0, PersistedState(Lifecycle("production", 0, "", ""))),
                     0.0)
    payload = {"supply_temp_c": 45.0, "setpoint_c": 45.0, "alarms": ["pump_b_fault"],
               "ts_ns": 1}
    tick.cooling_state("rackplane/lab/rack1/valvey/state/supply_loop",
                       json.dumps(payload).encode(), retain=False, received_mono=5.0,
                       wall_ns=1)
    c = tick.cooling_reading()
    assert c is not None and c.alarms == ("pump_b_fault",)
    del payload["alarms"]
    tick.cooling_state("rackplane/lab/rack1/valvey/state/supply_loop",
                       json.dumps(payload).encode(), retain=False, received_mono=6.0,
                       wall_ns=2)
    c = tick.cooling_reading()
    assert c is not None and c.alarms is None  # not reported: never read as "none active"


def test_every_fault_pattern_names_one_of_valveys_alarm_kinds() -> None:
    kinds = {d.id.split(":", 1)[0] for d in alarm_defs(
        ValveyConfig(), ["a", "b"], ["a", "b"], ["s1"])}
    for pat in CoolingSettings().fault_alarms:
        assert any(fnmatch.fnmatchcase(k, pat) for k in kinds), pat
