"""What a daemon sends is shown by ``rackctl`` as written, never read as rich markup: any user
with a lease or a command can put text in a daemon's state (a lease reason is any string up to
200 characters), so a reason like ``[/x]`` raised ``rich.errors.MarkupError`` in every other
user's ``rackctl cmd … get_state`` and ``rackctl watch``, and an error message naming
``[commands.users]`` lost those words."""

from __future__ import annotations

from rich.console import Console

from rackctl.cli import _reply_table, _WatchView

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
        out = _render(_reply_table("valvey", "get_state", reply))
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
