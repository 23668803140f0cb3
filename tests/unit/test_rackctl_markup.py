"""What a daemon sends is shown by ``rackctl`` as written, never read as rich markup: any user
with a lease or a command can put text in a daemon's state (a lease reason is any string up to
200 characters), so a reason like ``[/x]`` raised ``rich.errors.MarkupError`` in every other
user's ``rackctl cmd … get_state`` and ``rackctl watch``, and an error message naming
``[commands.users]`` lost those words."""

from __future__ import annotations

from rich.console import Console

from rackctl.cli import _WatchView
from rackctl.watch_view import reply_table

HOSTILE = ["[/x] closed tag", "[commands.users]", "[bold]loud[/bold]", "[link=x]y[/link]", "]["]


def _render(renderable: object) -> str:
    console = Console(width=400, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_a_reply_shows_the_daemons_text_as_written() -> None:
    for text in HOSTILE:
        reply = {"ok": False, "request_id": text,
                 "error": {"code": "forbidden", "message": f"roles come from {text} config"},
                 "state": {"leases": {"valve": {"reason": text}}}}
        out = _render(reply_table("valvey", "get_state", reply))
        assert f"roles come from {text} config" in out, out
        assert out.count(text) >= 3, out  # request id, message, reason


def test_watch_shows_states_and_alarms_as_written() -> None:
    view = _WatchView("valvey")
    for i, text in enumerate(HOSTILE):
        view.update("state", f"s{i}", {"lease_reason": text})
        view.update("alarm", f"a{i}", {"severity": "major", "state": "raised",
                                       "message": text})
    out = _render(view.render())
    for text in HOSTILE:
        assert out.count(text) >= 2, (text, out)


def test_a_refusal_table_has_no_empty_state_row() -> None:
    """A refusal carries ``state: null``: its table ends with the error, not a ``- │ {}`` row."""
    reply = {"ok": False, "request_id": "r-1", "state": None,
             "error": {"code": "out_of_range", "message": "setpoint_c 99 over 45"}}
    out = _render(reply_table("valvey", "set_setpoint", reply))
    assert "setpoint_c 99 over 45" in out, out
    assert "{}" not in out and "│ -" not in out, out
    ok = _render(reply_table("valvey", "get_state", {"ok": True, "request_id": "r-2",
                                                      "error": None, "state": {}}))
    assert "{}" not in ok, ok
