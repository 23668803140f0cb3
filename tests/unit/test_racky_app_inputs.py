"""racky's MQTT input handlers (`racky.app.Racky`), fed `rackplane.io.mqtt.Message` objects the
way the broker link hands them over (no broker needed: the retained flag and the receive time
are what matter). A dead publisher's retained value is never taken as fresh; a retained or
duplicated tray message does not move the tray's reading."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from rackplane.clock import FakeClock
from rackplane.io.mqtt import Message
from rackplane.settings import Identity
from racky.app import Racky
from racky.config import RackyConfig
from sims.scenario import FabricSpec, ScenarioRun, load_scenario

WALL0 = 1_800_000_000 * 10**9


@pytest.fixture
def racky(tmp_path: Path) -> Racky:
    cfg = RackyConfig.model_validate({
        "lifecycle": {"state_file": str(tmp_path / "racky-state.json")},
        "spool": {"directory": str(tmp_path / "spool")},
        "cooling": {"plant_topic": "rackplane/lab/rack01/sim/telemetry/plant"},
    })
    return Racky(cfg, clock=FakeClock(start_mono=1000.0, start_wall_ns=WALL0))


def _msg(topic: str, body: dict[str, Any], *, retain: bool, t: float) -> Message:
    return Message(topic, json.dumps(body).encode(), qos=1, retain=retain, received_mono=t)


def _first_tray_payload() -> tuple[str, dict[str, Any]]:
    """(topic, payload) of tray 0 after one plant second of the virtual rack (no links)."""
    from sims.telemetry import tray_payloads

    sc = load_scenario("load-step-short").model_copy(
        update={"fabric": FabricSpec(enabled="off")})
    run = ScenarioRun(sc, model="rack")
    run.step(1.0)
    assert run.rack is not None
    return next(iter(tray_payloads(run.rack, Identity(), WALL0)))


def test_a_retained_cooling_state_counts_with_its_age_never_as_fresh(racky: Racky) -> None:
    stale = racky.cfg.power.derate.stale_after_s
    st = {"supply_temp_c": 45.2, "setpoint_c": 45.0, "flow_lpm": 900.0,
          "facility_supply_temp_c": 40.0}
    # valvey died an hour ago; its last state is still retained
    racky._on_cooling(_msg(racky.cooling_topic, {**st, "ts_ns": WALL0 - 3600 * 10**9},
                           retain=True, t=1000.0))
    c = racky.cooling_reading()
    assert c is not None and c.facility_supply_temp_c == 40.0
    assert 1000.0 - c.t_mono >= 3600.0 - 1e-6
    # retained without a timestamp: stale at once
    racky._on_cooling(_msg(racky.cooling_topic, st, retain=True, t=1000.0))
    c = racky.cooling_reading()
    assert c is not None and 1000.0 - c.t_mono > stale
    # a live message is fresh
    racky._on_cooling(_msg(racky.cooling_topic, {**st, "ts_ns": WALL0}, retain=False, t=1000.0))
    c = racky.cooling_reading()
    assert c is not None and c.t_mono == 1000.0


def test_plant_values_filling_in_for_valvey_keep_their_own_age(racky: Racky) -> None:
    topic = racky.cfg.cooling.plant_topic
    assert topic is not None
    racky._on_plant(_msg(topic, {"flow_lpm": 850.0, "facility_supply_temp_c": 41.0},
                         retain=False, t=900.0))  # the plant topic went quiet at 900 s
    racky._on_cooling(_msg(racky.cooling_topic, {"supply_temp_c": 45.1, "setpoint_c": 45.0},
                           retain=False, t=1000.0))
    c = racky.cooling_reading()
    assert c is not None and c.facility_supply_temp_c == 41.0 and c.t_mono == 900.0


def test_garbage_cooling_payloads_are_refused_and_the_reading_ages(racky: Racky) -> None:
    racky._on_cooling(_msg(racky.cooling_topic, {"supply_temp_c": 45.0}, retain=False, t=10.0))
    for raw in (b"\xff\xfe", b"[1, 2]", b"[" * 50_000):
        racky._on_cooling(Message(racky.cooling_topic, raw, received_mono=20.0))
    c = racky.cooling_reading()
    assert c is not None and c.t_mono == 10.0 and c.supply_temp_c == 45.0
    assert racky.racky_tick.payload_problems.get("cooling_state")


def test_retained_and_duplicated_tray_telemetry_does_not_refresh_the_tray(racky: Racky) -> None:
    topic, p = _first_tray_payload()
    thing = topic.rsplit("/", 1)[-1]
    t_topic = f"{racky.agent_base}/telemetry/{thing}"
    racky._on_agent_telemetry(_msg(t_topic, p, retain=False, t=100.0))
    k = p["tray"]
    assert racky.ingest.trays[k].t_mono == 100.0
    racky._on_agent_telemetry(_msg(t_topic, p, retain=False, t=101.0))  # duplicate
    racky._on_agent_telemetry(_msg(t_topic, p, retain=True, t=102.0))   # retained copy
    assert racky.ingest.trays[k].t_mono == 100.0
    assert racky.health()["agents"]["stale_messages"] == 2
    newer = copy.deepcopy(p)
    newer["ts_ns"] += 10**9
    racky._on_agent_telemetry(_msg(t_topic, newer, retain=False, t=103.0))
    assert racky.ingest.trays[k].t_mono == 103.0


def test_a_tray_message_on_another_trays_topic_is_refused(racky: Racky) -> None:
    _, p = _first_tray_payload()
    assert p["tray"] == 0
    # a misconfigured agent of tray 0 publishing on tray07's topic, and a topic with no index
    for thing in ("tray07", "trayX"):
        racky._on_agent_telemetry(_msg(f"{racky.agent_base}/telemetry/{thing}", p,
                                       retain=False, t=50.0))
    assert racky.ingest.trays == {} and racky.ingest.errors == 2  # both counted
    assert set(racky.racky_tick.payload_problems) == {"tray07", "trayX"}


def test_an_agent_reply_with_ok_as_a_string_is_not_success(racky: Racky) -> None:
    racky._pending["r1"] = ((3,), 0.0)
    racky._on_agent_reply(_msg(f"{racky.agent_base}/cmd/racky/set_power_limits/result",
                               {"request_id": "r1", "ok": "false", "error": None},
                               retain=False, t=1.0))
    assert racky.agent_stats["refused"] == 1 and racky.agent_stats["ok"] == 0


@pytest.mark.parametrize("payload", [
    b"[" * 100_000 + b"]" * 100_000,      # nesting past the parser's recursion limit
    b"{" + b" " * (1 << 20) + b"}",       # past MAX_INPUT_BYTES
    b"\xff\xfe not utf-8",
    b'["r1", true]',                     # JSON, not an object
])
def test_a_malformed_agent_reply_is_refused_like_every_input(racky: Racky,
                                                             payload: bytes) -> None:
    """Agent replies get the bounds every other input has: never a crash, the pending
    command stays pending (it times out as lost), the problem is kept for the log."""
    racky._pending["r1"] = ((3,), 0.0)
    topic = f"{racky.agent_base}/cmd/racky/set_power_limits/result"
    racky._on_agent_reply(Message(topic, payload, qos=1, retain=False, received_mono=1.0))
    assert "r1" in racky._pending
    assert racky.agent_stats["ok"] == racky.agent_stats["refused"] == 0
    assert "agent_reply" in racky.racky_tick.payload_problems


def test_a_silent_tray_is_alarmed_and_never_counted_as_zero_watts() -> None:
    """Tray 5's agent goes silent: its reading ages, ``tray_stale:tray05`` is raised, and the
    rack's IT power (no shelves here) becomes unknown instead of the sum of the other 17."""
    from racky.core.controller import RackyCore, RackyInputs
    from racky.core.lifecycle import Lifecycle, PersistedState
    from racky.core.telemetry import TelemetryIngest
    from sims.telemetry import tray_payloads

    cfg = RackyConfig()
    a = cfg.node_agents
    ing = TelemetryIngest(a.trays, a.gpus_per_tray, tuple(cfg.links.counters))
    core = RackyCore(cfg, 0.0, PersistedState(Lifecycle("production")))
    sc = load_scenario("load-step-short").model_copy(
        update={"fabric": FabricSpec(enabled="off")})
    run = ScenarioRun(sc, model="rack")
    raised: dict[str, float] = {}
    it_w: list[float | None] = []
    for s in range(1, 61):
        run.step(1.0)
        assert run.rack is not None
        for _, p in tray_payloads(run.rack, Identity(), WALL0 + s * 10**9):
            if not (p["tray"] == 5 and s > 10):
                ing.tray_payload(p, float(s))
        out = core.step(float(s), RackyInputs({}, dict(ing.trays), None, None), s)
        for ev in out.alarm_events:
            if ev.kind == "raised":
                raised.setdefault(ev.id, float(s))
        it_w.append(out.it_power_w)
    assert "tray_stale:tray05" in raised, raised
    assert 10.0 + a.stale_after_s <= raised["tray_stale:tray05"] <= 40.0
    assert all(x is not None for x in it_w[:10])
    assert all(x is None for x in it_w[int(10 + a.stale_after_s) + 1:])


def test_an_oversized_payload_is_refused_before_parsing(racky: Racky) -> None:
    from rackplane.core.envelope import MAX_INPUT_BYTES

    big = b'{"tray": 0, "pad": "' + b"x" * MAX_INPUT_BYTES + b'"}'
    racky._on_agent_telemetry(Message(f"{racky.agent_base}/telemetry/tray00", big,
                                      received_mono=5.0))
    assert racky.ingest.trays == {} and "more than" in racky.racky_tick.payload_problems["tray00"]
    racky._on_cooling(Message(racky.cooling_topic, big, received_mono=5.0))
    assert racky.cooling_reading() is None
    assert "more than" in racky.racky_tick.payload_problems["cooling_state"]


def test_h8_every_refused_tray_message_is_counted_and_logged_once_per_change(
        racky: Racky) -> None:
    """Refusals before the ingest (bad topic, oversize, not JSON, too deep, not the contract)
    count in ``payload_errors`` like the ingest's own; the log line comes once per change of
    reason, not once per message."""
    from structlog.testing import capture_logs

    from rackplane.core.envelope import MAX_INPUT_BYTES

    _, p = _first_tray_payload()
    base = f"{racky.agent_base}/telemetry/tray{p['tray']:02d}"
    negative = json.dumps({**p, "power_w": -5.0}).encode()
    no_leak = json.dumps({k: v for k, v in p.items() if k != "leak"}).encode()
    sent = ([(base, b"not json")] * 5
            + [(base, b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}")] * 3
            + [(base, b" " * (MAX_INPUT_BYTES + 1))] * 3
            + [(f"{racky.agent_base}/telemetry/trayXX", json.dumps(p).encode())] * 2
            + [(base, negative)] * 4 + [(base, no_leak)])
    with capture_logs() as logs:
        for i, (topic, raw) in enumerate(sent):
            racky._on_agent_telemetry(Message(topic, raw, received_mono=100.0 + i))
    assert racky.health()["agents"]["payload_errors"] == len(sent) == 18
    assert racky.ingest.trays == {}
    refused = [e for e in logs if e["event"] == "agent_telemetry_refused"]
    assert len(refused) == 6  # one per change of reason (trayXX has its own)


def test_contract_v1_newer_minor_fields_are_ignored_and_another_major_refused(
        racky: Racky) -> None:
    """Through the daemon's handler (bytes as the broker hands them over): a 1.4 agent's
    message with fields 1.0 does not know is taken, its unknown fields kept once each in the
    ingest (``TelemetryIngest.ignored_fields``, for ``state/health``); a 2.0 message is
    refused and counted; the simulator's truth topic is not a tray and is not read."""
    _, p = _first_tray_payload()
    base = f"{racky.agent_base}/telemetry/tray{p['tray']:02d}"
    for i in range(3):
        newer = {**p, "schema_version": "1.4", "ts_ns": WALL0 + i, "fan_rpm": 9000,
                 "agent": {**p["agent"], "mode": "eco"}}
        racky._on_agent_telemetry(Message(base, json.dumps(newer).encode(),
                                          received_mono=10.0 + i))
    assert racky.ingest.trays[p["tray"]].t_mono == 12.0
    assert racky.ingest.ignored_fields == {"fan_rpm", "agent.mode"}
    assert racky.ingest.ignored_field_count == 2 and racky.ingest.errors == 0
    v2 = {**p, "schema_version": "2.0", "ts_ns": WALL0 + 10}
    racky._on_agent_telemetry(Message(base, json.dumps(v2).encode(), received_mono=20.0))
    assert racky.ingest.errors == 1
    assert "major version 2" in racky.racky_tick.payload_problems["tray00"]
    racky._on_agent_telemetry(Message(f"{racky.agent_base}/telemetry/truth", b"{}",
                                      received_mono=21.0))
    assert racky.ingest.errors == 1


def test_the_simulators_plant_topic_beside_the_agents_telemetry_is_the_plant(
        tmp_path: Path) -> None:
    """The plant topic may sit on the agents' own level (``<...>/sim/telemetry/plant``, the
    simulator's): it is read as the plant, never as a tray message."""
    cfg = RackyConfig.model_validate({
        "lifecycle": {"state_file": str(tmp_path / "racky-state.json")},
        "spool": {"directory": str(tmp_path / "spool")},
    })
    plant = f"{cfg.mqtt.topic_root}/{cfg.identity.site}/{cfg.identity.rack}/" \
            f"{cfg.node_agents.daemon}/telemetry/plant"
    cfg = cfg.model_copy(update={"cooling": cfg.cooling.model_copy(
        update={"plant_topic": plant})})
    r = Racky(cfg, clock=FakeClock(start_mono=1000.0, start_wall_ns=WALL0))
    r._on_plant(_msg(plant, {"flow_lpm": 850.0, "facility_supply_temp_c": 41.0},
                     retain=False, t=999.0))
    r._on_cooling(_msg(r.cooling_topic, {"supply_temp_c": 45.1}, retain=False, t=1000.0))
    c = r.cooling_reading()
    assert c is not None and c.flow_lpm == 850.0 and c.facility_supply_temp_c == 41.0
    assert r.ingest.errors == 0 and not r.racky_tick.payload_problems


@pytest.mark.parametrize("ts_ns", [7_258_118_400 * 10**9, WALL0 * 1000, WALL0 + 3600 * 10**9])
def test_a_retained_cooling_state_stamped_in_the_future_is_stale(racky: Racky, ts_ns: int
                                                                 ) -> None:
    """Acceptance round 2 of issue 14: a retained state stamped in the future (year 2200, ns
    x 1000, an hour ahead) gave age 0 and was taken as fresh; its age is unknown: stale."""
    stale = racky.cfg.power.derate.stale_after_s
    st = {"supply_temp_c": 45.2, "setpoint_c": 45.0, "flow_lpm": 900.0,
          "facility_supply_temp_c": 40.0, "ts_ns": ts_ns}
    racky._on_cooling(_msg(racky.cooling_topic, st, retain=True, t=1000.0))
    c = racky.cooling_reading()
    assert c is not None and 1000.0 - c.t_mono > stale


def test_an_ok_agent_reply_keeps_its_read_back_in_either_layout(racky: Racky) -> None:
    """Contract 1.3's reply state is read (per-GPU read-back kept per tray); an older agent's
    layout is read and counted as legacy; an unreadable state is counted and logged once, the
    command still counts as ok (the agent applied it)."""
    topic = f"{racky.agent_base}/cmd/racky/set_power_limits/result"
    new = {"schema_version": "1.3", "epoch": 7, "confirmed": False, "trays": [
        {"tray": 3, "epoch": 7, "powered": None, "power_cap_w": None,
         "gpu_power_cap_w": 500.0, "cap_expires_in_s": 60.0, "enforced_tray_cap_w": None,
         "gpus": [{"gpu": 12 + i, "enforced_w": w} for i, w in
                  enumerate([500.0, 500.0, 500.0, None])]}]}
    old = {"trays": [{"tray": 4, "enforced_gpu_cap_w": 600.0, "enforced_tray_cap_w": 2700.0}],
           "stale_refused": 0}
    for rid, trays, state in (("r1", (3,), new), ("r2", (4,), old),
                              ("r3", (5,), {"schema_version": "1.3", "epoch": 7})):
        racky._pending[rid] = (trays, 0.0)
        racky._on_agent_reply(_msg(topic, {"request_id": rid, "ok": True, "error": None,
                                           "state": state}, retain=False, t=1.0))
    s = racky.agent_stats
    assert (s["ok"], s["unconfirmed"], s["legacy_replies"], s["bad_reply_state"]) == (3, 1, 1, 1)
    rb = racky.racky_tick.agent_readback
    assert rb[3].enforced_gpu_w[3] == [500.0, 500.0, 500.0, None] and not rb[3].legacy
    assert rb[4].enforced_tray_cap_w[4] == 2700.0 and rb[4].legacy
    assert 5 not in rb
    assert "agent_reply_state" in racky.racky_tick.payload_problems
