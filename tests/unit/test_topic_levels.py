"""Every topic level the daemons build or accept in config is one rule (issue 14 item 11,
rackplane.core.names): no wildcards, separators, leading '$', control characters, and no '.'
or space (NATS's MQTT listener disconnects a client publishing one). Alarm ids are
``kind:subject``, built by one function (docs/CONTRACTS.md "Topic levels, alarm ids and
replies")."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rackctl.client import ClientSettings
from rackplane.config import load_config, validate_data
from rackplane.core.alarms import AlarmDef
from rackplane.core.names import TOPIC_LEVEL_PATTERN, alarm_id, check_topic_level
from rackplane.core.topics import Topics
from rackplane.errors import ConfigError
from rackplane.io.selfmetrics import TELEMETRY_ALARMS
from rackplane.settings import MqttSettings
from racky.commands import racky_contract
from racky.config import RackyConfig
from racky.core.alarmbank import kind_of_def
from racky.core.controller import RackyCore
from racky.core.lifecycle import Lifecycle, PersistedState
from valvey.commands import valvey_contract
from valvey.config import ValveyConfig
from valvey.core.controller import ValveyCore
from valvey.core.sensors import resolve_topic

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config"

# What must never be inside a level, whatever the rule's alphabet becomes.
FORBIDDEN = re.compile(r"[./+#\s\x00-\x1f\x7f*>]")

# Subjects as agents and devices may name them (alarm_id must make each a safe level).
SUBJECTS = ["tray05", "gpu07/nic1", "gpu07/port03", "shelf-u3", "psu3.shelf1", "mlx5_0.1",
            "GPU 7", "a+b", "#", "$SYS", "x\x00y", "é", "a" * 100, "supply_temp_c"]


def _level_ok(level: str) -> bool:
    return bool(level) and not level.startswith("$") and not FORBIDDEN.search(level) \
        and len(level) <= 64


def _assert_levels(topics: set[str], root: str) -> None:
    bad = []
    for t in sorted(topics):
        assert t.startswith(root + "/"), t
        for level in t[len(root) + 1:].split("/"):
            if not _level_ok(level) or not re.match(TOPIC_LEVEL_PATTERN, level):
                bad.append((t, level))
    assert bad == []


def _valvey_configs() -> Iterator[ValveyConfig]:
    yield ValveyConfig()
    yield load_config(ValveyConfig, CONFIG / "valvey.example.toml")


def _racky_configs() -> Iterator[RackyConfig]:
    yield RackyConfig()
    yield load_config(RackyConfig, CONFIG / "racky.example.toml")


def test_every_topic_valvey_can_generate_has_safe_levels() -> None:
    """valvey's own topics (status, states, every alarm it defines, every verb for every
    configured user), its requests to racky and the sensor topics it subscribes to. Fails on
    the old ``supply_sensor_fault.<point>`` ids."""
    for cfg in _valvey_configs():
        root = cfg.mqtt.topic_root
        t = Topics(root, cfg.identity, "valvey")
        core = ValveyCore.from_config(cfg, 0.0, extra_alarms=TELEMETRY_ALARMS)
        contract = valvey_contract()
        users = [*cfg.commands.users, cfg.mqtt.username or "valvey", "rita"]
        topics = {t.status, *(t.state(s) for s in [*contract.states, "health", "leak",
                                                   "leases"])}
        topics |= {t.alarm(aid) for aid in core.alarms.defs}
        topics |= {t.cmd_result(u, v) for u in users for v in contract.verbs}
        racky = Topics(root, cfg.identity, cfg.racky.daemon)
        ruser = cfg.racky.user or cfg.mqtt.username or "valvey"
        topics |= {racky.cmd_result(ruser, v) for v in racky_contract().verbs}
        topics |= {resolve_topic(s.topic, root, cfg.identity.site, cfg.identity.rack)
                   for s in cfg.sensors.topics()}
        assert any(":" in aid for aid in core.alarms.defs)  # the per-sensor alarms are here
        _assert_levels(topics, root)


def test_every_topic_racky_can_generate_has_safe_levels() -> None:
    """racky's own topics, every alarm kind about any subject an agent or device may name,
    its commands to the node agents and the cooling topics it reads."""
    for cfg in _racky_configs():
        root = cfg.mqtt.topic_root
        t = Topics(root, cfg.identity, "racky")
        core = RackyCore(cfg, 0.0, PersistedState(Lifecycle("production", 0, "", "")))
        kinds = [*core.bank.kinds, *(kind_of_def(d).kind for d in TELEMETRY_ALARMS)]
        assert len(kinds) >= 20
        contract = racky_contract()
        topics = {t.status, *(t.state(s) for s in [*contract.states, "health", "leases"])}
        topics |= {t.alarm(alarm_id(k, s)) for k in kinds for s in ["", *SUBJECTS]}
        users = [*cfg.commands.users, "valvey", "alice"]
        topics |= {t.cmd_result(u, v) for u in users for v in contract.verbs}
        agents = Topics(root, cfg.identity, cfg.node_agents.daemon)
        auser = cfg.node_agents.user or cfg.mqtt.username or "racky"
        topics |= {agents.cmd_result(auser, "set_power_limits"),
                   agents.telemetry(f"{cfg.node_agents.tray_thing_prefix}17")}
        topics.add(Topics(root, cfg.identity, cfg.cooling.daemon).state(cfg.cooling.state_thing))
        if cfg.cooling.plant_topic:
            topics.add(cfg.cooling.plant_topic)
        _assert_levels(topics, root)


@pytest.mark.parametrize("subject", SUBJECTS)
def test_alarm_id_is_kind_colon_subject_and_always_one_safe_level(subject: str) -> None:
    aid = alarm_id("link_flapping", subject)
    assert aid.startswith("link_flapping:") and _level_ok(aid)
    AlarmDef(id=aid, severity="major", message="m")  # the engine accepts it


def test_alarm_id_examples_and_rack_wide() -> None:
    assert alarm_id("link_flapping", "gpu07/nic1") == "link_flapping:gpu07-nic1"
    assert alarm_id("cap_drift", "tray05") == "cap_drift:tray05"
    assert alarm_id("supply_sensor_fault", "supply.temp.b") == "supply_sensor_fault:supply-temp-b"
    assert alarm_id("budget_exceeded") == "budget_exceeded"
    for kind in ("a.b", "A", "a:b", "", "a b"):
        with pytest.raises(ValueError, match="alarm kind"):
            alarm_id(kind, "x")


@pytest.mark.parametrize("aid", ["link_flapping.gpu07-nic1", "a b", "a/b", "+", "#", "$x", "",
                                 "A", "x" * 65, "cap_drift\n"])
def test_alarm_def_refuses_ids_that_are_not_safe_levels(aid: str) -> None:
    with pytest.raises(ValueError, match="alarm id"):
        AlarmDef(id=aid, severity="major", message="m")


HOSTILE = ["+", "#", "a/b", "$SYS", "$ops", "a b", " alice", "alice\t", "al\x00ice", "",
           "x" * 65, "alice.smith", "a*b", "a>b", "é", "alice\n", "x" * 64 + "\n"]


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize(("model", "path"), [
    (ValveyConfig, "mqtt.username"), (ValveyConfig, "mqtt.client_id"),
    (ValveyConfig, "identity.site"), (ValveyConfig, "identity.rack"),
    (ValveyConfig, "identity.row"), (ValveyConfig, "racky.user"),
    (ValveyConfig, "racky.daemon"), (ValveyConfig, "cdu.name"),
    (RackyConfig, "mqtt.username"), (RackyConfig, "node_agents.user"),
    (RackyConfig, "node_agents.daemon"), (RackyConfig, "cooling.daemon"),
    (RackyConfig, "cooling.state_thing"), (RackyConfig, "node_agents.tray_thing_prefix"),
])
def test_config_refuses_every_hostile_topic_level(model: type, path: str, value: str) -> None:
    """Every config value that becomes a topic level (or the client id) refuses the whole kind
    of bad value, naming the key."""
    if path == "mqtt.client_id" and value == "x" * 65:
        value = "x" * 201  # client ids may be longer than a level (up to 200)
    section, key = path.split(".")
    with pytest.raises(ConfigError) as err:
        validate_data(model, {section: {key: value}}, "<test>")
    assert path in str(err.value)


@pytest.mark.parametrize("value", HOSTILE)
def test_config_refuses_hostile_command_users_and_topic_levels(value: str) -> None:
    with pytest.raises(ConfigError, match=r"commands\.users"):
        validate_data(ValveyConfig, {"commands": {"users": {value: "operator"}}}, "<test>")
    if value and "/" not in value:  # inside a topic "a/b" is two good levels
        with pytest.raises(ConfigError, match=r"sensors\.room_temp\.topic"):
            validate_data(ValveyConfig, {"sensors": {"room_temp": {
                "name": "room_temp_c", "topic": f"{{root}}/{{site}}/bms/{value}/env",
                "field": "t"}}}, "<test>")
        with pytest.raises(ConfigError, match=r"cooling\.plant_topic"):
            validate_data(RackyConfig, {"cooling": {"plant_topic": f"rackplane/x/{value}"}},
                          "<test>")
        with pytest.raises(ConfigError, match=r"mqtt\.topic_root"):
            validate_data(ValveyConfig, {"mqtt": {"topic_root": f"fleet/{value}"}}, "<test>")


@pytest.mark.parametrize("field", ["username", "user", "site", "rack"])
@pytest.mark.parametrize("value", ["+", "#", "a/b", "$SYS", "a.b", "a b", "", "alice\n"])
def test_rackctl_refuses_hostile_identity(field: str, value: str) -> None:
    with pytest.raises(ValueError, match=field):
        ClientSettings(**{field: value})


def test_good_identity_values_pass() -> None:
    s = MqttSettings(username="valvey-lab_rack12:a", client_id="valvey-" + "x" * 150)
    assert s.username == "valvey-lab_rack12:a"
    assert check_topic_level("A0_:-") == "A0_:-"


def test_check_config_refuses_a_wildcard_username(tmp_path: Path) -> None:
    """``valvey --check-config`` exits 2 naming the key (not just load in a test)."""
    cfg = tmp_path / "valvey.toml"
    cfg.write_text('[mqtt]\nusername = "ops/+"\n')
    run = subprocess.run([sys.executable, "-m", "valvey", "--config", str(cfg),
                          "--check-config"], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "mqtt.username" in run.stdout + run.stderr


def test_shipped_acl_patterns_grant_only_reads_without_name_substitution() -> None:
    """config/mosquitto/rackplane.acl: a ``pattern`` applies to every user; one with %u or %c
    substitutes a name the broker does not restrict (e.g. 'a/b'), one with write lets every
    user publish. So every pattern is a read of status/state/alarm/telemetry under the fixed
    root, with no %u/%c; per-user grants are ``topic`` lines under ``user``. (Main's ACL had
    ``pattern read .../cmd/%u/+/result/#``.) The broker behaviour: test_tls_acl.py."""
    acl = (CONFIG / "mosquitto" / "rackplane.acl").read_text()
    patterns = [ln.split() for ln in acl.splitlines() if ln.startswith("pattern")]
    assert patterns
    for p in patterns:
        assert len(p) == 3 and p[1] == "read", p
        assert "%u" not in p[2] and "%c" not in p[2], p
        # status/+: a redundant pair's per-instance status (docs/OPERATIONS.md §6)
        assert re.fullmatch(r"rackplane/\+/\+/\+/(status|status/\+|state/#|alarm/#|telemetry/#)",
                            p[2]), p
    assert "Why every \"pattern\" line below is safe" in acl
    # Commanding users read their own replies through their own lines.
    for user in re.findall(r"^user (\S+)$", acl, flags=re.M):
        block = acl.split(f"user {user}\n", 1)[1].split("\nuser ", 1)[0]
        if f"cmd/{user}/+\n" in block + "\n" and user not in ("valvey", "racky"):
            assert f"topic read rackplane/+/+/+/cmd/{user}/+/result/#" in block, user


def test_a_trailing_newline_is_no_part_of_any_name() -> None:
    """Acceptance round 2 of issue 14: Python's ``$`` matches before a final newline, so
    ``"valvey\n"`` passed every name check written as ``re.match(r"^...$")`` (usernames,
    client ids, site/rack, alarm ids, register-map names, lease outputs, thing names, the
    tray contract's version). Each refuses it now."""
    from rackplane.core.leases import LeaseTable
    from rackplane.core.names import alarm_id, check_client_id, is_alarm_id
    from rackplane.core.registers import parse_register_map
    from rackplane.core.tray_contract import parse_version

    with pytest.raises(ValueError):
        check_topic_level("valvey\n")
    with pytest.raises(ValueError):
        check_client_id("valvey-1\n")
    with pytest.raises(ValueError):
        alarm_id("cap_drift\n", "x")
    assert not is_alarm_id("cap_drift\n")
    assert parse_version("1.0\n") is None
    with pytest.raises(ValueError):
        LeaseTable(["valve\n"])
    for point, device in (("flow_lpm\n", "cdu"), ("flow_lpm", "cdu\n")):
        with pytest.raises(ConfigError, match=r"\\n"):
            parse_register_map({"device": {"name": device}, "points": [
                {"name": point, "table": "input", "address": 0, "type": "uint16"}]})
    with pytest.raises(ConfigError):
        validate_data(RackyConfig, {"links": {"counters": {"link_downed": "8/saturate\n"}}},
                      "<test>")


@pytest.mark.parametrize("verb", ["get_state", "set_budget"])
def test_a_request_id_with_a_trailing_newline_is_not_echoed(verb: str) -> None:
    """The reply's request_id is the request's only when it is one (schema pattern), else
    null: ``"r-1\\n"`` was echoed, a reply its own schema refuses."""
    import json

    from rackplane.core.envelope import CommandReply
    from tests.unit.test_racky_commands import Message, drive, make_rack

    rig = make_rack()
    env = json.loads(json.dumps({"request_id": "r-1\n", "issued_at": "2026-01-01T00:00:00Z",
                                 "args": {}}))
    msg = Message(topic=rig.link.topics.cmd("alice", verb), payload=json.dumps(env).encode(),
                  qos=1, retain=False, dup=False, received_mono=rig.clock.monotonic())
    drive(rig.router.handle(msg))
    (reply,) = rig.replies
    assert reply["request_id"] is None and not reply["ok"]
    CommandReply.model_validate(reply)
    msg = Message(topic=rig.link.topics.cmd("alice", verb) + "\n", payload=json.dumps(
        {**env, "request_id": "r-2"}).encode(), qos=1, retain=False, dup=False,
        received_mono=rig.clock.monotonic())
    drive(rig.router.handle(msg))
    assert rig.replies[-1]["error"]["code"] in ("unknown_verb", "bad_topic"), rig.replies[-1]
