"""tray-agent end to end on a real Mosquitto with nvidia-ml-py's real ctypes path over a
stand-in ``libnvidia-ml.so.1`` (tests/standin/nvml_standin.c, built here with gcc: limits
constrained to [min, max], a set taking effect after a delay, drawn power clamped by the
enforced limit, a clock-event bit no agent knows).

- ``--dry-connect`` prints every reading once (exit 1 when a configured GPU cannot be read);
- the daemon publishes ``telemetry/tray03`` that racky's own receive path (`RackyTick.message`:
  decode, contract checks, plausibility windows) accepts: **0 refused**;
- ``set_power_limits``: the reply comes after the read-back; what is published is what the
  GPUs report (enforced), clamped targets say so; a cap below the device minimum is
  ``out_of_range``, an older epoch ``stale_epoch`` (also after a restart: persisted), a power
  state change ``not_supported``; when racky goes silent past ``ttl_s`` the GPUs go to the safe
  cap, never uncapped; a set the driver refuses is logged once and the truth is reported.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness.daemons import Proc, command_envelope, daemon_proc, until
from harness.servers import Mosquitto
from rackplane.core.tray_reply import SetPowerLimitsReply
from racky.config import RackyConfig
from racky.core.controller import RackyCore
from racky.core.lifecycle import Lifecycle, PersistedState
from racky.tick import RackyTick
from tests.adapters.mqtt_cli import MqttSub, Received, mqtt_pub
from tests.standin.build import build_nvml_standin

pytestmark = [pytest.mark.servers]

BASE = "rackplane/lab/rack01/trays"
CMD = f"{BASE}/cmd/racky/set_power_limits"


def _config(tmp: Path, port: int, **caps: Any) -> Path:
    caps = {"safe_gpu_cap_w": 700.0, "confirm_timeout_s": 3.0,
            "epoch_file": str(tmp / "epochs.json"), **caps}
    caps_toml = "".join(f"{k} = {json.dumps(v)}\n" for k, v in caps.items())
    text = f"""
[identity]
site = "lab"
row = "row1"
rack = "rack01"
[mqtt]
host = "127.0.0.1"
port = {port}
[spool]
directory = "{tmp / 'spool'}"
[control]
tick_s = 0.2
[caps]
{caps_toml}
[agents]
daemon = "trays"
[[agents.trays]]
tray = 3
nvml_devices = [0, 1, 2, 3]
non_gpu_power_w = 400.0
coolant_out_temp_c = 45.0
"""
    path = tmp / "tray-agent.toml"
    path.write_text(text)
    return path


def _env(lib: Path, **kw: str) -> dict[str, str]:
    return {"LD_LIBRARY_PATH": str(lib), "STANDIN_NVML_DEMAND_MW": "1100000",
            "STANDIN_NVML_SET_DELAY_MS": "300", "STANDIN_NVML_EXTRA_REASONS": "0x10000", **kw}


def _racky(**sections: Any) -> RackyTick:
    cfg = RackyConfig.model_validate({"identity": {"site": "lab", "row": "row1",
                                                   "rack": "rack01"},
                                      "node_agents": {"daemon": "trays"}, **sections})
    ps = PersistedState(Lifecycle(cfg.lifecycle.initial_state, time.time_ns(), "new", "test"))
    return RackyTick(cfg, RackyCore(cfg, 0.0, ps), 0.0)


def _trays(sub: MqttSub, start: int = 0) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in sub.messages[start:]
            if m.topic == f"{BASE}/telemetry/tray03"]


async def _command(port: int, sub: MqttSub, args: dict[str, Any]) -> dict[str, Any]:
    rid = uuid.uuid4().hex
    start = len(sub.messages)
    await mqtt_pub(port, CMD, command_envelope(rid, {"schema_version": "1.0", "trays": [3],
                                                     **args}))

    def mine(m: Received) -> bool:
        return m.topic == f"{CMD}/result" and json.loads(m.payload)["request_id"] == rid

    reply = await sub.wait_for(mine, timeout_s=15.0, start=start)
    return json.loads(reply.payload)


async def _tray_where(sub: MqttSub, pred: Any, what: str, proc: Proc) -> dict[str, Any]:
    start = len(sub.messages)
    found: list[dict[str, Any]] = []

    def cond() -> bool:
        found[:] = [t for t in _trays(sub, start) if pred(t)]
        return bool(found)

    await until(cond, 15.0, what, proc)
    return found[0]


def test_dry_connect_prints_every_reading_and_fails_for_an_unreadable_gpu(
        tmp_path: Path) -> None:
    lib = build_nvml_standin(tmp_path / "lib")
    cfg = _config(tmp_path, 1)
    argv = [sys.executable, "-m", "trayagent", "--config", str(cfg), "--dry-connect"]
    ok = subprocess.run(argv, env={**os.environ, **_env(lib)}, capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    out = " ".join(ok.stdout.split())
    assert "nvml: 4 GPUs" in out
    for dev, gpu in zip(range(4), range(12, 16), strict=True):
        assert f"device {dev} (tray 3 gpu {gpu}): power_w=1000.0 (average)" in out
    assert out.count("unknown_reason_bits=0x10000") == 4
    assert "reasons=['sw_power_cap']" in out and "min_w=200.0 max_w=1200.0" in out
    lost = subprocess.run(argv, env={**os.environ, **_env(lib, STANDIN_NVML_LOST="2")},
                          capture_output=True, text=True, timeout=60)
    assert lost.returncode == 1
    assert "device 2: power_w: GPU is lost" in " ".join(lost.stdout.split())
    nolib = subprocess.run(argv, env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path)},
                           capture_output=True, text=True, timeout=60)
    assert nolib.returncode == 1 and "NVML" in nolib.stdout


async def test_agent_publishes_what_racky_accepts_and_enforces_reads_back_and_falls_back(
        tmp_path: Path, mosquitto: Mosquitto) -> None:
    lib = build_nvml_standin(tmp_path / "lib")
    cfg = _config(tmp_path, mosquitto.port)
    racky = _racky()
    async with MqttSub(mosquitto.port, f"{BASE}/#") as sub:
        agent = daemon_proc("trayagent", tmp_path, cfg, env=_env(lib)).start()
        # from the start the GPUs are held at the safe cap (read back after the delay)
        t = await _tray_where(sub, lambda t: t["agent"]["enforced_gpu_cap_w"] == 700.0,
                              "the safe cap enforced", agent)
        assert t["agent"]["power_cap_w"] is None and t["agent"]["epoch"] is None
        assert [g["power_w"] for g in t["gpus"]] == [700.0] * 4  # clamped by the limit
        assert t["power_w"] == 4 * 700.0 + 400.0
        assert all(g["throttle_reasons"] == ["sw_power_cap"] for g in t["gpus"])
        assert t["agent"]["capping"]

        r = await _command(mosquitto.port, sub, {"epoch": 5, "gpu_power_cap_w": 500.0,
                                                 "ttl_s": 3.0})
        assert r["ok"], r
        st = r["state"]
        assert st["confirmed"] is True
        assert [g["enforced_w"] for g in st["trays"][0]["gpus"]] == [500.0] * 4
        t = await _tray_where(sub, lambda t: t["agent"]["gpu_power_cap_w"] == 500.0,
                              "racky's cap reported", agent)
        assert t["agent"]["enforced_gpu_cap_w"] == 500.0 and t["agent"]["epoch"] == 5

        r = await _command(mosquitto.port, sub, {"epoch": 5, "gpu_power_cap_w": 5000.0,
                                                 "ttl_s": 3.0})
        SetPowerLimitsReply.model_validate(r["state"])  # the contract's reply, clamp and all
        g0 = r["state"]["trays"][0]["gpus"][0]
        assert r["ok"] and g0["target_w"] == 1200.0 and "above the device maximum" in \
            g0["clamped"] and g0["enforced_w"] == 1200.0
        t = await _tray_where(sub, lambda t: t["agent"]["cap_clamped"] is True,
                              "the clamp reported", agent)
        assert t["gpus"][0]["power_limit_w"] == 1200.0
        assert (t["gpus"][0]["power_limit_min_w"], t["gpus"][0]["power_limit_max_w"]) == \
            (200.0, 1200.0)

        refused = {
            "out_of_range": {"epoch": 5, "power_cap_w": 400.0, "ttl_s": 3.0},
            "stale_epoch": {"epoch": 4, "gpu_power_cap_w": 600.0, "ttl_s": 3.0},
            "not_supported": {"epoch": 5, "powered": False},
            "unknown_tray": {"epoch": 5, "trays": [3, 4], "gpu_power_cap_w": 600.0,
                             "ttl_s": 3.0},
        }
        for code, args in refused.items():
            r = await _command(mosquitto.port, sub, args)
            assert not r["ok"] and r["error"]["code"] == code, (code, r)

        # racky silent: the 3 s TTL runs out -> safe cap, racky's caps reported null
        t = await _tray_where(sub, lambda t: t["agent"]["gpu_power_cap_w"] is None
                              and t["agent"]["enforced_gpu_cap_w"] == 700.0,
                              "the safe cap after the TTL", agent)
        assert t["agent"]["cap_expires_in_s"] is None and t["agent"]["epoch"] == 5

        # a release is racky deciding "uncapped": the device default
        r = await _command(mosquitto.port, sub, {"epoch": 6, "release": ["gpu_power_cap_w"]})
        assert r["ok"] and {g["source"] for g in r["state"]["trays"][0]["gpus"]} == \
            {"default"}
        assert agent.stop() == 0

        # restarted: the newest epoch (6) was persisted
        agent2 = daemon_proc("trayagent", tmp_path, cfg, env=_env(lib), tag="2").start()
        await _tray_where(sub, lambda t: True, "telemetry after the restart", agent2)
        r = await _command(mosquitto.port, sub, {"epoch": 5, "gpu_power_cap_w": 600.0,
                                                 "ttl_s": 3.0})
        assert not r["ok"] and r["error"]["code"] == "stale_epoch"
        assert agent2.stop() == 0

    trays = _trays(sub)
    assert len(trays) >= 10
    for m in sub.messages:
        if m.topic.endswith("/telemetry/tray03"):
            racky.message(m.topic, m.payload, retain=m.retain, received_mono=time.monotonic(),
                          wall_ns=time.time_ns())
    assert (racky.ingest.errors, racky.ingest.stale_messages) == (0, 0), racky.payload_problems
    assert racky.implausible_inputs() == {}
    events = [e["event"] for e in agent.events()]
    assert events.count("clock_event_bits_unknown") == 4  # once per GPU, not every cycle
    assert events.count("caps_expired_safe_cap") == 1


async def test_dry_run_and_a_refused_set_report_the_truth(tmp_path: Path,
                                                          mosquitto: Mosquitto) -> None:
    lib = build_nvml_standin(tmp_path / "lib")
    async with MqttSub(mosquitto.port, f"{BASE}/#") as sub:
        dry = daemon_proc("trayagent", tmp_path, _config(tmp_path, mosquitto.port,
                                                         dry_run=True, confirm_timeout_s=0.5),
                          env=_env(lib), tag="dry").start()
        await _tray_where(sub, lambda t: True, "telemetry", dry)
        r = await _command(mosquitto.port, sub, {"epoch": 1, "gpu_power_cap_w": 500.0,
                                                 "ttl_s": 60.0})
        assert r["ok"] and r["state"]["confirmed"] is False and r["state"]["dry_run"]
        t = await _tray_where(sub, lambda t: t["agent"]["gpu_power_cap_w"] == 500.0,
                              "the cap set", dry)
        assert t["agent"]["enforced_gpu_cap_w"] == 1000.0  # nothing was set: the truth
        assert dry.stop() == 0
        would = [e for e in dry.events() if e["event"] == "power_limit_dry_run"]
        assert {(e["gpu"], e["would_set_w"]) for e in would} >= {(g, 500.0)
                                                                 for g in range(12, 16)}

        denied = daemon_proc("trayagent", tmp_path, _config(tmp_path, mosquitto.port,
                                                            confirm_timeout_s=0.5),
                             env=_env(lib, STANDIN_NVML_SET_ERROR="4"), tag="denied").start()
        t = await _tray_where(sub, lambda t: True, "telemetry", denied)
        await asyncio.sleep(1.0)  # several cycles, each retrying the set
        assert _trays(sub)[-1]["agent"]["enforced_gpu_cap_w"] == 1000.0
        assert denied.stop() == 0
    failed = [e for e in denied.events() if e["event"] == "power_limit_set_failed"]
    assert len(failed) == 4 and "Insufficient Permissions" in failed[0]["error"]


async def test_a_hanging_driver_stops_the_publishing_without_piling_up_reads(
        tmp_path: Path, mosquitto: Mosquitto) -> None:
    lib = build_nvml_standin(tmp_path / "lib")
    delay = tmp_path / "delay_ms"
    delay.write_text("0")
    text = _config(tmp_path, mosquitto.port).read_text().replace(
        "tick_s = 0.2", "tick_s = 0.2\nread_timeout_s = 0.5")
    cfg = tmp_path / "hang.toml"
    cfg.write_text(text)
    racky = _racky()
    async with MqttSub(mosquitto.port, f"{BASE}/#") as sub:
        agent = daemon_proc("trayagent", tmp_path, cfg, tag="hang",
                            env=_env(lib, STANDIN_NVML_READ_DELAY_FILE=str(delay))).start()
        await _tray_where(sub, lambda t: True, "telemetry", agent)
        delay.write_text("1500")  # each GPU's power read now hangs 1.5 s: a cycle takes 6 s
        await asyncio.sleep(1.0)  # the cycle under way when it started may still publish
        n = len(_trays(sub))
        await asyncio.sleep(2.5)
        assert len(_trays(sub)) == n  # nothing published from late or hung reads
        delay.write_text("0")
        await _tray_where(sub, lambda t: True, "telemetry once the driver answers", agent)
        assert agent.stop() == 0
    for m in sub.messages:
        if m.topic.endswith("/telemetry/tray03"):
            racky.message(m.topic, m.payload, retain=m.retain, received_mono=time.monotonic(),
                          wall_ns=time.time_ns())
    assert (racky.ingest.errors, racky.ingest.stale_messages) == (0, 0)
    events = [e["event"] for e in agent.events()]
    assert events.count("gpu_read_timeout") == 1  # once per episode
    assert events.count("gpu_source_answers") == 1


async def test_sysfs_ports_are_published_per_gpu_and_racky_reads_them(
        tmp_path: Path, mosquitto: Mosquitto) -> None:
    from tests.unit.test_trayagent_sysfs import PCI, _two_ports

    lib = build_nvml_standin(tmp_path / "lib")
    sysroot = tmp_path / "sys"
    _two_ports(sysroot, 1, ports=("1", "2", "3", "4"))
    text = _config(tmp_path, mosquitto.port).read_text().replace(
        "coolant_out_temp_c = 45.0",
        'coolant_out_temp_c = 45.0\ngpu_ports = [["mlx5_0/1"], ["mlx5_0/2"], ["mlx5_0/3"], '
        '["mlx5_0/4"]]')
    text += f'[sysfs]\nenabled = true\nroot = "{sysroot}"\n'
    cfg = tmp_path / "ports.toml"
    cfg.write_text(text)
    racky = _racky(links={
        "counters": {"symbol_error": "16/saturate", "link_downed": "8/saturate",
                     "carrier_changes": "32/wrap"},
        "zero_rate_counters": ["link_downed"], "pre_fec_nvlink": "symbol_error",
        "pre_fec_nic": "symbol_error", "counter_max_rate_per_s": {"link_downed": 100.0}})
    async with MqttSub(mosquitto.port, f"{BASE}/#") as sub:
        agent = daemon_proc("trayagent", tmp_path, cfg, env=_env(lib), tag="ports").start()
        t = await _tray_where(sub, lambda t: all(g.get("ports") for g in t["gpus"]),
                              "every GPU's ports", agent)
        assert t["gpus"][1]["ports"]["names"] == ["gpu13/mlx5_0/2"]
        assert t["gpus"][1]["ports"]["counters"]["carrier_changes"] == [4]
        (sysroot / PCI / "infiniband" / "mlx5_0" / "ports" / "2" / "counters" /
         "symbol_error").write_text("N/A\n")
        t = await _tray_where(sub, lambda t: t["gpus"][1]["ports"] is None,
                              "GPU 13's ports withdrawn", agent)
        assert all(t["gpus"][i]["ports"] for i in (0, 2, 3))
        assert agent.stop() == 0
    for m in sub.messages:
        if m.topic.endswith("/telemetry/tray03"):
            racky.message(m.topic, m.payload, retain=m.retain, received_mono=time.monotonic(),
                          wall_ns=time.time_ns())
    assert (racky.ingest.errors, racky.ingest.stale_messages) == (0, 0), racky.payload_problems
    why = [e["reason"] for e in agent.events() if e["event"] == "gpu_ports_not_published"
           and e["gpu"] == 13]
    assert why[-1] == "mlx5_0/2: symbol_error unknown (not a count: 'N/A')"
