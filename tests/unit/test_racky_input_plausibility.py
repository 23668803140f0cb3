"""racky's inputs for its limits (issue 14): cooling values outside their plausibility windows
are not believed (the cooling reading is unknown: the derate holds) and alarm per input; a
shelf's failed poll does not end a good value before the shelves' stale limit."""

from __future__ import annotations

import json

import pytest

from rackplane.core.samples import Quality, good, invalid
from racky.config import RackyConfig
from racky.core.controller import RackyCore
from racky.core.lifecycle import Lifecycle, PersistedState
from racky.tick import RackyTick

WALL = 1_800_000_000 * 10**9


def _tick() -> RackyTick:
    cfg = RackyConfig()
    ps = PersistedState(Lifecycle(cfg.lifecycle.initial_state, WALL, "new", "test"))
    return RackyTick(cfg, RackyCore(cfg, 0.0, ps), 0.0)


def _cooling(t: RackyTick, now: float, **vals: float) -> None:
    body = {"supply_temp_c": 45.0, "setpoint_c": 45.0, "flow_lpm": 198.0,
            "facility_supply_temp_c": 38.0, **vals}
    t.message(t.topics.cooling, json.dumps(body).encode(), retain=False, received_mono=now,
              wall_ns=WALL)


@pytest.mark.parametrize(("name", "value"), [
    ("supply_temp_c", 318.15),          # kelvin
    ("facility_supply_temp_c", 100.4),  # °F
    ("flow_lpm", 1e9),
    ("flow_lpm", -3.0),
])
def test_cooling_input_outside_its_window_is_unknown_and_alarmed(name: str, value: float
                                                                 ) -> None:
    t = _tick()
    _cooling(t, 1.0)
    assert t.cooling_reading() is not None
    t.step(1.0, WALL)
    _cooling(t, 2.0, **{name: value})
    assert t.cooling_reading() is None  # unknown: the derate holds, the thermal state unknown
    assert name in t.implausible_inputs()
    eff = t.step(2.0, WALL)
    ids = {a.id for a in t.core.bank.active()}
    assert any(i.startswith("input_implausible") and i.endswith(name) for i in ids), ids
    assert eff is not None
    _cooling(t, 3.0)
    assert t.cooling_reading() is not None
    t.step(3.0, WALL)
    assert not any(a.id.startswith("input_implausible") for a in t.core.bank.active())


def test_shelf_failed_poll_holds_the_last_good_value_until_the_stale_limit() -> None:
    t = _tick()
    ok = good("output_power_w", 90_000.0, "W", WALL, 10.0)
    t.shelf_samples("shelf1", [ok])
    t.shelf_samples("shelf1", [invalid("output_power_w", "W", WALL, 12.0, Quality.STALE,
                                       "timeout")])
    assert t.latest["shelf1"]["output_power_w"] is ok  # good until its stale limit
    late = invalid("output_power_w", "W", WALL, 10.0 + t._shelf_hold_s + 0.5, Quality.STALE,
                   "timeout")
    t.shelf_samples("shelf1", [late])
    assert t.latest["shelf1"]["output_power_w"] is late


def test_shelf_power_outside_the_register_window_alarms_naming_shelf_and_point() -> None:
    """A shelf's output power outside its window (decoder: OUT_OF_RANGE): the rack power is
    unknown (never a partial sum), and the alarm names the shelf and the point."""
    from rackplane.core.samples import make_sample

    t = _tick()
    t.shelf_samples("shelf1", [make_sample("shelf_output_power_w", 9e6, "W", WALL, 1.0,
                                           Quality.OUT_OF_RANGE, "out_of_range")])
    t.step(1.0, WALL)
    ids = {a.id for a in t.core.bank.active()}
    assert any(i.startswith("input_implausible") and "shelf1-shelf_output_power_w" in i
               for i in ids), ids


def _tray_message(**gpu0: float) -> tuple[str, bytes]:
    from rackplane.settings import Identity
    from sims.scenario import FabricSpec, ScenarioRun, load_scenario
    from sims.telemetry import tray_payloads

    sc = load_scenario("load-step-short").model_copy(
        update={"fabric": FabricSpec(enabled="off")})
    run = ScenarioRun(sc, model="rack")
    run.step(1.0)
    assert run.rack is not None
    topic, body = next(iter(tray_payloads(run.rack, Identity(), WALL)))
    body = json.loads(json.dumps(body))
    body["gpus"][0].update(gpu0)
    return topic, json.dumps(body).encode()


@pytest.mark.parametrize("gpu0", [{"temp_c": 345.0}, {"power_w": 1.2e6}, {"temp_c": -40.0}])
def test_tray_message_with_an_implausible_gpu_figure_is_refused_and_alarmed(
        gpu0: dict[str, float]) -> None:
    """A GPU temperature in kelvin or a power in mW: the message is not believed (the tray's
    previous reading stays and ages, as for any refused message), alarm names the tray."""
    t = _tick()
    topic, good_msg = _tray_message()
    tray_topic = t.topics.telemetry.removesuffix("+") + topic.rsplit("/", 1)[-1]
    t.agent_telemetry(tray_topic, good_msg, retain=False, received_mono=1.0)
    before = dict(t.ingest.trays)
    assert before
    _, bad_msg = _tray_message(**gpu0)
    body = json.loads(bad_msg)
    body["ts_ns"] = body["ts_ns"] + 10**9
    t.agent_telemetry(tray_topic, json.dumps(body).encode(), retain=False, received_mono=2.0)
    assert t.ingest.trays == before  # the implausible reading never replaced the last one
    t.step(2.0, WALL)
    ids = {a.id for a in t.core.bank.active()}
    assert any(i.startswith("input_implausible") for i in ids), ids


def test_a_shelf_poll_slower_than_the_shelves_stale_limit_is_refused() -> None:
    with pytest.raises(ValueError, match=r"poll_interval_s .* must be shorter"):
        RackyConfig.model_validate({"power_shelves": [
            {"name": "s1", "host": "127.0.0.1", "port": 5021, "register_map": "power-shelf",
             "poll_interval_s": 10.0}]})
