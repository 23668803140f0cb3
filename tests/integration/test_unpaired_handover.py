"""``handover`` sent to a single instance (``[leadership]`` off) of valvey and racky over a real
Mosquitto: refused with ``not_paired`` and a message saying the daemon is not part of a
redundant pair. It used to answer ``unknown_verb`` with the list of every verb, as if the
operator had mistyped (the verb exists: one of a pair answers it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness.daemons import command_envelope, daemon_proc, write_config
from harness.servers import Mosquitto, free_port
from rackplane.commands import CommandReply
from rackplane.core.pair_sync import NOT_PAIRED
from tests.adapters.mqtt_cli import MqttSub, mqtt_pub

pytestmark = [pytest.mark.servers, pytest.mark.slow]


def _config(daemon: str, tmp: Path, rack: str, mqtt_port: int) -> Path:
    common: dict[str, dict[str, Any]] = {
        "identity": {"site": "lab", "rack": rack},
        "mqtt": {"port": mqtt_port, "reconnect_min_s": 0.1, "reconnect_max_s": 1.0},
        "commands": {"users": {"op1": "operator"}},
        "spool": {"directory": str(tmp / f"spool-{daemon}")},
    }
    if daemon == "racky":
        return write_config(tmp / "racky.toml", **common,
                            lifecycle={"state_file": str(tmp / "racky-state.json")},
                            validation={"report_dir": str(tmp / "reports")})
    # no CDU answers on this port: valvey's command path runs all the same
    return write_config(tmp / "valvey.toml", **common, cdu={"port": free_port()})


@pytest.mark.parametrize("daemon", ["valvey", "racky"])
async def test_handover_to_a_single_instance_is_refused_as_not_paired(
        tmp_path: Path, mosquitto: Mosquitto, daemon: str) -> None:
    rack = f"r{uuid.uuid4().hex[:10]}"
    conf = _config(daemon, tmp_path, rack, mosquitto.port)
    base = f"rackplane/lab/{rack}/{daemon}"
    proc = daemon_proc(daemon, tmp_path, conf, env={"PYTHONUNBUFFERED": "1"}).start()
    try:
        async with MqttSub(mosquitto.port, f"{base}/cmd/op1/+/result", v5=False) as sub:
            reply = None
            for i in range(60):  # the daemon may still be starting: ask again
                n = len(sub.messages)
                await mqtt_pub(mosquitto.port, f"{base}/cmd/op1/handover",
                               command_envelope(f"h{i}", {"reason": "maintenance"}))
                with contextlib.suppress(TimeoutError):
                    m = await sub.wait_for(lambda m: m.topic.endswith("/handover/result"),
                                           1.0, n)
                    reply = CommandReply.model_validate(json.loads(m.payload))
                    break
                assert proc.alive(), proc.log.read_text()[-3000:]
            assert reply is not None, proc.log.read_text()[-3000:]
            assert not reply.ok and reply.error is not None and reply.state is None, reply
            assert reply.error.code == NOT_PAIRED, reply
            assert f"this {daemon} is not part of a redundant pair" in reply.error.message
            assert "known verbs" not in reply.error.message
    finally:
        proc.stop()
        await asyncio.to_thread(proc.wait, 30)
