"""systemd notification: a ``NOTIFY_SOCKET`` the daemon cannot use is said once at start
(issue 14 item 15), never dropped without a word."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from rackplane.clock import FakeClock
from rackplane.io.service import Notifier


def _unusable_logs(logs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [e for e in logs if e["event"] == "systemd_notify_socket_unusable"]


@pytest.mark.parametrize("address", [
    "vsock:2:1234",          # systemd >= 254 in a VM: AF_VSOCK
    "vsock-mux:/run/x.sock",
    "run/notify.sock",       # a relative path (systemd sets absolute ones)
    "./notify.sock",
    "tcp://127.0.0.1:9",
])
def test_an_address_the_library_cannot_use_is_logged_once(
        address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A socket exists at the relative path: the library would connect to it relative to the
    # working directory, which systemd never means.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    for rel in ("run/notify.sock", "notify.sock"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(str(tmp_path / rel))
    with capture_logs() as logs:
        n = Notifier(FakeClock(), environ={"NOTIFY_SOCKET": address})
        n.ready("up")
        n.stopping()
    (line,) = _unusable_logs(logs)
    assert line["notify_socket"] == address and line["log_level"] == "error"
    assert n.unusable and "Type=notify" in str(line["effect"])


def test_an_absolute_socket_nobody_listens_on_is_logged(tmp_path: Path) -> None:
    with capture_logs() as logs:
        n = Notifier(FakeClock(), environ={"NOTIFY_SOCKET": str(tmp_path / "absent.sock")})
    (line,) = _unusable_logs(logs)
    assert "cannot connect" in str(line["reason"]) and n.unusable


def test_a_usable_socket_gets_the_messages_and_no_warning(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.bind(str(path))
    sink.settimeout(2)
    with capture_logs() as logs:
        n = Notifier(FakeClock(), environ={"NOTIFY_SOCKET": str(path)})
        n.ready("up")
    assert not _unusable_logs(logs) and n.unusable is None
    assert sink.recv(100) == b"READY=1\nSTATUS=up"
    # The listener goes away: the failure is logged once, counted, never raised.
    sink.close()
    path.unlink()
    with capture_logs() as logs:
        n.status("a")
        n.status("b")
    assert [e["event"] for e in logs].count("systemd_notify_failed") == 1
    assert n.send_errors == 2


def test_no_notify_socket_is_quiet() -> None:
    with capture_logs() as logs:
        n = Notifier(FakeClock(), environ={})
        n.ready()
    assert logs == [] and n.unusable is None
