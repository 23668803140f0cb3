"""An alarm's log record carries a level by its severity (a log-based pager must see a
critical alarm as critical), and only its raising is logged above info."""

from __future__ import annotations

import pytest

from rackplane.core.alarms import AlarmEvent
from rackplane.core.effects import alarm_event


def event(kind: str, severity: str) -> AlarmEvent:
    return AlarmEvent(id="leak_tray3", kind=kind, severity=severity,  # type: ignore[arg-type]
                      message="leak", value=1.0, t_mono=0.0)


@pytest.mark.parametrize(("severity", "level"), [
    ("critical", "critical"), ("major", "error"), ("minor", "warning"), ("warning", "warning"),
    ("unheard-of", "error"),
])
def test_a_raised_alarm_is_logged_at_its_severity(severity: str, level: str) -> None:
    log, _payload, _line = alarm_event(event("raised", severity), None, 0)
    assert (log.event, log.level, log.fields["severity"]) == ("alarm", level, severity)


@pytest.mark.parametrize("kind", ["cleared", "acked", "shelved", "unshelved", "returned"])
def test_the_other_events_of_a_critical_alarm_are_info(kind: str) -> None:
    log, _payload, _line = alarm_event(event(kind, "critical"), None, 0)
    assert log.level == "info"


def test_default_log_stream_follows_sys_stderr(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A log configured on the default stream writes to the stderr of the moment: a stream
    replaced and closed since (a test runner's capture) raises nothing."""
    import io
    import sys

    import structlog

    from rackplane.log import configure_logging

    old = io.StringIO()
    monkeypatch.setattr(sys, "stderr", old)
    configure_logging(fmt="json")
    old.close()
    new = io.StringIO()
    monkeypatch.setattr(sys, "stderr", new)
    structlog.get_logger("t").info("after_the_swap")
    assert "after_the_swap" in new.getvalue()
    structlog.reset_defaults()
