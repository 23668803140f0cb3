"""``rackctl watch`` without a terminal: one plain line per message (`rackctl.watch_view`).
A daemon's text (any user can put a lease reason of up to 200 characters in a state) never
breaks a line or forges a ``key=value``."""

from __future__ import annotations

import json

from rackctl.watch_view import WatchView, plain_value

HOSTILE = ["two words", 'a "quote"', "k=v", "line\nbreak", "tab\there", "", "[/x]", "\x1b[31m"]


def _feed(view: WatchView, kind: str, name: str, body: object) -> list[str]:
    view.update(kind, name, body)
    return view.lines(kind, name, body)


def test_each_message_gives_one_line_per_kind() -> None:
    view = WatchView("valvey")
    assert _feed(view, "status", "", {"status": "online"}) == ["valvey: online"]
    assert _feed(view, "state", "supply_loop", {"setpoint_c": 41.0, "pid": {"p": 1.5},
                                                "mode": "auto"}) == [
        "state/supply_loop setpoint_c=41.0 pid.p=1.5 mode=auto"]
    assert _feed(view, "alarm", "cdu_comm_lost", {
        "severity": "major", "state": "active", "acked": False, "shelved": False,
        "message": "no CDU answer"}) == [
        'alarm/cdu_comm_lost severity=major state=active acked=False shelved=False '
        'message="no CDU answer"']
    assert _feed(view, "alarm", "cdu_comm_lost", None) == ["alarm/cdu_comm_lost cleared"]
    assert _feed(view, "status", "", {"status": "offline"}) == ["valvey: offline"]
    assert _feed(view, "other", "x", {"a": 1}) == []


def test_a_daemons_text_stays_one_token_on_one_line() -> None:
    view = WatchView("valvey")
    for i, text in enumerate(HOSTILE):
        for line in (_feed(view, "state", f"s{i}", {"lease_reason": text})
                     + _feed(view, "alarm", f"a{i}", {"severity": "minor", "message": text})):
            assert "\n" not in line and "\r" not in line, line
            # the value is the last token: read back exactly
            value = line.split("=", 1)[1] if line.startswith("state/") else \
                line.split(" message=", 1)[1]
            assert (json.loads(value) if value.startswith('"') else value) == text, line
    assert plain_value("online") == "online"


def test_a_pair_shows_its_status_line_when_its_roles_arrive() -> None:
    view = WatchView("valvey")
    assert _feed(view, "status", "a", {"status": "online"}) == ["valvey: no_active (pair: a ?)"]
    got = _feed(view, "state", "pair_a", {"role": "active", "epoch": 3})
    assert got == ["state/pair_a role=active epoch=3", "valvey: online (pair: a active epoch 3)"]
    # the same roles again: the state line only
    assert _feed(view, "state", "pair_a", {"role": "active", "epoch": 3}) == [
        "state/pair_a role=active epoch=3"]
