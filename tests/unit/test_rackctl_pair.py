"""rackctl's pair view (rackctl/pair.py): single or pair, which instance is active, never
"offline" for a pair only because the rack-level status is absent (issue 15 item 5)."""

from __future__ import annotations

from typing import Any

from rackctl.pair import PairView, handover_message

ONLINE = {"status": "online"}
OFFLINE = {"status": "offline"}


def pair_state(role: str, epoch: int, **kw: Any) -> dict[str, Any]:
    return {"instance": "x", "role": role, "epoch": epoch, "fence_in_s": 9.5,
            "takeover_in_s": None, "last_change": "acquired: rev 12", "acquisitions": 2,
            "synced_age_s": 0.4, "alarms": [], **kw}


def test_single_instance_is_its_rack_level_status() -> None:
    v = PairView()
    assert v.mode == "unknown" and v.daemon_status() == "unknown"
    v.update("status", "", ONLINE)
    assert v.mode == "single" and v.daemon_status() == "online"
    v.update("status", "", OFFLINE)
    assert v.daemon_status() == "offline"


def test_pair_without_rack_level_status_is_online_with_one_active() -> None:
    v = PairView()
    v.update("status", "a", ONLINE)
    v.update("status", "b", ONLINE)
    v.update("state", "pair_a", pair_state("active", 12))
    v.update("state", "pair_b", pair_state("standby", 0, fence_in_s=0.0, takeover_in_s=14.2,
                                           synced_age_s=0.2))
    assert v.update("state", "health", {"x": 1}) is False
    s = v.summary()
    assert (s["mode"], s["status"], s["active"], s["epoch"]) == ("pair", "online", "a", 12)
    assert s["lease_remaining_s"] == 9.5 and s["last_change"] == "acquired: rev 12"
    assert s["instances"]["b"]["takeover_in_s"] == 14.2
    assert s["instances"]["b"]["synced_age_s"] == 0.2
    assert str(v.status_line("valvey")) == "valvey: online (pair: a active epoch 12, b standby)"


def test_standby_death_does_not_make_the_pair_offline_but_active_death_does() -> None:
    v = PairView()
    for i, role, ep in (("a", "active", 12), ("b", "standby", 0)):
        v.update("status", i, ONLINE)
        v.update("state", f"pair_{i}", pair_state(role, ep))
    v.update("status", "b", OFFLINE)  # the standby's Last Will
    assert v.daemon_status() == "online" and v.active() == ["a"]
    assert "b offline" in str(v.status_line("valvey"))
    v.update("status", "a", OFFLINE)  # the active's Last Will: its retained state says active
    assert v.daemon_status() == "offline" and v.summary()["active"] is None


def test_no_active_and_two_active_are_reported() -> None:
    v = PairView()
    for i in ("a", "b"):
        v.update("status", i, ONLINE)
        v.update("state", f"pair_{i}", pair_state("standby", 0))
    assert v.daemon_status() == "no_active"
    v.update("state", "pair_a", pair_state("active", 12))
    v.update("state", "pair_b", pair_state("active", 13))
    assert v.daemon_status() == "two_active" and v.summary()["active"] is None


def test_a_cleared_retained_topic_forgets_the_instance() -> None:
    v = PairView()
    v.update("status", "a", ONLINE)
    v.update("state", "pair_a", pair_state("active", 3))
    v.update("status", "a", None)
    v.update("state", "pair_a", None)
    assert v.mode == "unknown"


def test_handover_messages() -> None:
    ok = {"ok": True, "request_id": "r", "error": None,
          "state": {"released_epoch": 12, "instance": "a"}}
    assert "instance a released its lease (epoch 12)" in handover_message("valvey", ok)
    no = {"ok": False, "request_id": "r", "state": None,
          "error": {"code": "unknown_verb", "message": "unknown verb 'handover'; known verbs: "
                    "acquire_lease, release_lease, get_state, set_setpoint"}}
    line = handover_message("valvey", no)
    # one line that says why, not an older single instance's list of every verb it has
    assert "runs as a single instance" in line and "unknown_verb" in line
    assert "known verbs" not in line and "set_setpoint" not in line
    single = {"ok": False, "request_id": "r", "state": None,
              "error": {"code": "not_paired", "message": "this valvey is not part of a "
                        "redundant pair"}}
    line = handover_message("valvey", single)
    assert "not part of a redundant pair" in line and "(not_paired;" in line
    un = {"ok": False, "request_id": "r", "state": None,
          "error": {"code": "unavailable", "message": "the KV store did not confirm"}}
    assert "nothing was released" in handover_message("valvey", un)
