"""config/nats/rackplane-permissions.conf is what rackplane.natsacl generates from the Mosquitto
ACL (the two cannot drift), and the translation grants the same topics (issue 15 item 3)."""

from __future__ import annotations

import itertools
import re

import pytest

from rackplane import natsacl
from rackplane.natsacl import AclError, parse_acl, render, topic_to_subjects


def test_shipped_permissions_are_generated_from_the_acl() -> None:
    assert natsacl.main(["--check"]) == 0, "run: python -m rackplane.natsacl --write"


def test_check_fails_on_a_drifted_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "p.conf"
    out.write_text(natsacl.OUT_PATH.read_text().replace('"rackplane.*.*.*.cmd.alice.*"',
                                                        '"rackplane.>"'))
    assert natsacl.main(["--check", "--out", str(out)]) == 1


def _mqtt_match(filt: str, topic: str) -> bool:
    f, t = filt.split("/"), topic.split("/")
    for i, lv in enumerate(f):
        if lv == "#":
            return True
        if i >= len(t) or (lv != "+" and lv != t[i]):
            return False
    return len(f) == len(t)


def _nats_match(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


def _perms(text: str) -> dict[str, dict[str, list[str]]]:
    """The generated file's variables: name → {publish, subscribe} allow lists."""
    out: dict[str, dict[str, list[str]]] = {}
    for m in re.finditer(r"^(RACKPLANE_PERMS_\w+) = \{\n(.*?)^\}", text, re.S | re.M):
        body = m.group(2)
        pub = re.search(r"publish: \{ allow: \[(.*?)\] \}", body, re.S)
        sub = re.search(r"subscribe: \{ allow: \[(.*?)\] \}", body, re.S)
        assert sub is not None
        out[m.group(1)] = {
            "publish": re.findall(r'"([^"]+)"', pub.group(1)) if pub else [],
            "subscribe": re.findall(r'"([^"]+)"', sub.group(1)),
        }
    return out


# Topics of every kind (DESIGN §3) for daemons, peers and users, incl. a pair's.
LEVELS = {
    "daemon": ["valvey", "racky", "sim"],
    "tail": ["status", "status/a", "state/pair_a", "state", "telemetry/supply",
             "alarm/no_active_controller:a", "cmd/alice/handover", "cmd/bms/set_mode",
             "cmd/valvey/set_cap", "cmd/racky/set_cap", "cmd/alice/handover/result",
             "cmd/alice/handover/result/n1", "cmd/grafana/get_state", "other/x"],
}


def test_generated_grants_equal_the_acl_on_every_topic_kind() -> None:
    acl = parse_acl(natsacl.ACL_PATH.read_text())
    perms = _perms(natsacl.OUT_PATH.read_text())
    users = {**{u: g for u, g in acl.users.items()}, "READER": natsacl.Grants()}
    assert set(perms) == {f"RACKPLANE_PERMS_{u.upper()}" for u in users}
    checked = 0
    for (user, g), daemon, tail in itertools.product(users.items(), LEVELS["daemon"],
                                                     LEVELS["tail"]):
        topic = f"rackplane/lab/r1/{daemon}/{tail}"
        subject = topic.replace("/", ".")
        p = perms[f"RACKPLANE_PERMS_{user.upper()}"]
        may_write = any(_mqtt_match(f, topic) for f in g.write)
        may_read = any(_mqtt_match(f, topic) for f in [*g.read, *acl.patterns.read])
        assert any(_nats_match(s, subject) for s in p["publish"]) == may_write, (user, topic)
        assert any(_nats_match(s, subject) for s in p["subscribe"]) == may_read, (user, topic)
        checked += 1
    assert checked == len(users) * 3 * len(LEVELS["tail"])


def test_readers_publish_nothing_and_daemons_own_only_their_lease_keys() -> None:
    perms = _perms(natsacl.OUT_PATH.read_text())
    assert perms["RACKPLANE_PERMS_READER"]["publish"] == []
    assert 'publish: { deny: ">" }' in natsacl.OUT_PATH.read_text()
    v = perms["RACKPLANE_PERMS_VALVEY"]["publish"]
    assert any(_nats_match(s, "$KV.rackplane_leases.lab.r1.valvey") for s in v)
    assert any(_nats_match(s, "$KV.rackplane_leases.lab.r1.valvey.sync") for s in v)
    assert not any(_nats_match(s, "$KV.rackplane_leases.lab.r1.racky") for s in v)
    assert not any(_nats_match(s, "$JS.API.STREAM.DELETE.KV_rackplane_leases") for s in v)
    assert not any(s.startswith("$KV") for s in perms["RACKPLANE_PERMS_ALICE"]["publish"])


@pytest.mark.parametrize("topic", ["a/b.c/d", "a/b c", "a//b", "a/#/b", "a/x+", "a/*"])
def test_topics_without_a_nats_equivalent_are_refused(topic: str) -> None:
    with pytest.raises(AclError):
        topic_to_subjects(topic)


@pytest.mark.parametrize("line", ["pattern read rackplane/%u/#", "topic read x",
                                  "user a\ntopic deny x", "user a/b", "bogus x"])
def test_acl_lines_not_translated_are_refused(line: str) -> None:
    with pytest.raises(AclError):
        render(parse_acl(line))


def test_hash_also_grants_the_parent_level() -> None:
    assert topic_to_subjects("rackplane/+/state/#") == ["rackplane.*.state", "rackplane.*.state.>"]


# --- the fleet bucket (issue 16): rlc writes budgets, each rack's racky its own keys ---------

def _fleet_users(text: str) -> dict[str, tuple[str, dict[str, list[str]]]]:
    """The fleet file's user variables: name → (user, {publish, subscribe})."""
    out = {}
    for m in re.finditer(r"^(RACKPLANE_FLEET_USER_\w+) = \{\n(.*?)^\}", text, re.S | re.M):
        body = m.group(2)
        user = re.search(r'user: "([^"]+)"', body)
        pub = re.search(r"publish: \{ allow: \[(.*?)\] \}", body, re.S)
        sub = re.search(r"subscribe: \{ allow: \[(.*?)\] \}", body, re.S)
        assert user is not None and pub is not None and sub is not None
        out[m.group(1)] = (user.group(1), {"publish": re.findall(r'"([^"]+)"', pub.group(1)),
                                           "subscribe": re.findall(r'"([^"]+)"', sub.group(1))})
    return out


def test_every_rack_of_the_topology_has_its_fleet_user_listed_in_authorization() -> None:
    site, racks = natsacl.fleet_racks(natsacl.RLC_CONFIG_PATH.read_text())
    users = _fleet_users(natsacl.FLEET_PATH.read_text())
    assert {u for u, _ in users.values()} == {f"racky-{site}-{r}" for r in racks}
    auth = (natsacl.FLEET_PATH.parent / "authorization.conf").read_text()
    listed = set(re.findall(r"^\s*\$(RACKPLANE_FLEET_USER_\w+)\s*$", auth, re.M))
    assert listed == set(users)
    assert "include fleet-permissions.conf" in auth


def test_a_racks_fleet_user_owns_its_keys_only_and_rlc_writes_every_budget() -> None:
    users = _fleet_users(natsacl.FLEET_PATH.read_text())
    _, p = users["RACKPLANE_FLEET_USER_LAB_RACK1"]
    pub, sub = p["publish"], p["subscribe"]

    def can(grants: list[str], subject: str) -> bool:
        return any(_nats_match(s, subject) for s in grants)

    b = "$KV.rackplane_fleet"
    assert can(pub, f"{b}.lab.rack1.rack") and can(sub, f"{b}.lab.rack1.budget")
    assert can(pub, "$JS.API.STREAM.INFO.KV_rackplane_fleet")
    assert can(pub, "$JS.API.STREAM.MSG.GET.KV_rackplane_fleet")
    for subject in (f"{b}.lab.rack2.rack", f"{b}.lab.rack1.budget", f"{b}.other.rack1.rack",
                    "$JS.API.STREAM.CREATE.KV_rackplane_fleet",
                    "$JS.API.STREAM.DELETE.KV_rackplane_fleet",
                    "$JS.API.STREAM.INFO.KV_rackplane_leases", "$KV.rackplane_leases.lab.x.racky",
                    "rackplane.lab.rack1.racky.status"):
        assert not can(pub, subject), subject
    assert not can(sub, f"{b}.lab.rack2.budget") and not can(sub, "_INBOX_racky-lab-rack2.x")
    rlc = _perms(natsacl.OUT_PATH.read_text())["RACKPLANE_PERMS_RLC"]["publish"]
    assert can(rlc, f"{b}.lab.rack1.budget") and can(rlc, f"{b}.s2.r9.budget")
    assert can(rlc, "$JS.API.STREAM.CREATE.KV_rackplane_fleet")
    assert can(rlc, "$KV.rackplane_leases.lab.rlc.rlc")            # rlc's leadership key
    assert not can(rlc, f"{b}.lab.rack1.rack")                     # racks' reports: theirs
    racky = _perms(natsacl.OUT_PATH.read_text())["RACKPLANE_PERMS_RACKY"]["publish"]
    assert not any(s.startswith(b) for s in racky)                  # only the per-rack users


@pytest.mark.parametrize("text", ["[topology]\nsite = 'lab'\n", "x = 1\n",
                                  "[topology]\nsite = 'lab'\nhalls = {h = {rows = {r = {racks "
                                  "= {'a.b' = {}}}}}}\n",
                                  "[topology]\nsite = 'lab'\nhalls = {h1 = {rows = {r = {racks "
                                  "= {a = {}}}}}, h2 = {rows = {r = {racks = {a = {}}}}}}\n"])
def test_a_topology_without_racks_or_with_bad_or_repeated_names_is_refused(text: str) -> None:
    with pytest.raises(AclError):
        natsacl.render_fleet(*natsacl.fleet_racks(text))
