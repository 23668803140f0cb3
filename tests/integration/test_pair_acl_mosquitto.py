"""The shipped Mosquitto ACL lets a pair's instance publish its own ``status/<instance>`` and
every user read it; nobody else may publish there (issue 15: per-instance status topics).
The shipped production config (tests/integration/secure_broker.py), real Mosquitto."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.integration.secure_broker import SecureBroker, start_secure_broker
from tests.servers import require_binary

pytestmark = [pytest.mark.servers]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    require_binary("mosquitto_pub", "mosquitto-clients")
    b = start_secure_broker(tmp_path_factory.mktemp("pair-acl"))
    yield b
    b.stop()


def _cli(b: SecureBroker, tool: str, user: str, *args: str) -> list[str]:
    return [tool, "-h", "127.0.0.1", "-p", str(b.port), "--cafile", str(b.ca_file),
            "-u", user, "-P", b.passwords[user], "-V", "mqttv5", *args]


def test_instance_status_written_by_its_daemon_only_and_read_by_all(
        broker: SecureBroker) -> None:
    rack = f"r{uuid.uuid4().hex[:8]}"
    base = f"rackplane/lab/{rack}"
    pubs = [("valvey", f"{base}/valvey/status/a", True),
            ("racky", f"{base}/racky/status/b", True),
            ("racky", f"{base}/valvey/status/b", False),
            ("alice", f"{base}/valvey/status/c", False),
            ("rita", f"{base}/valvey/status/d", False)]
    for user, topic, _ in pubs:
        subprocess.run(_cli(broker, "mosquitto_pub", user, "-t", topic, "-m",
                            '{"status": "online"}', "-r", "-q", "1"),
                       capture_output=True, text=True, timeout=20)
    expected = sorted(t for _, t, ok in pubs if ok)
    for reader in ("rita", "alice", "valvey"):
        out = subprocess.run(_cli(broker, "mosquitto_sub", reader, "-t", f"{base}/+/status/+",
                                  "-v", "-W", "2"), capture_output=True, text=True, timeout=20)
        got = sorted(line.split(" ", 1)[0] for line in out.stdout.splitlines() if line)
        assert got == expected, (reader, out.stdout, out.stderr)
