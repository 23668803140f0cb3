"""The real tray agent on the virtual rack, with a real Mosquitto and a real racky: the
contract messages racky refused, the agent's CPU per tray and the cap command → enforced
read-back latency (issue 18's targets).

One child process (``python -m harness.simagent``) runs the virtual rack with its own node
agents off and one `trayagent.app.TrayAgent` hosting its 18 trays through the simulated
source (`harness.simagent`); racky (`racky.app.Racky`) runs in this process against the
simulator's power shelves (Modbus TCP) with a budget below the scenario's load, so it caps
the trays through the agent. A subscriber here sees every ``set_power_limits`` and its reply.

Figures (`RunFigures`):

- ``refused``: tray messages racky refused (``ingest.errors``: not JSON, not the contract, a
  bad value) and command replies it counted refused (``agent_stats["refused"]``);
  ``unreadable_reply_states``: ok replies whose ``state`` racky could not read as the
  contract's reply (``agent_stats["bad_reply_state"]``, plus ``legacy_replies``: the older
  layouts, which an agent of this tree must not send);
- ``agent_cpu_core_per_tray``: (child process CPU − the simulator's plant-tick CPU) / trays /
  wall: an upper bound of the agent's share (the simulator's MQTT and Modbus I/O run in the
  same event loop and are counted as the agent's); ``agent_read_cpu_core_per_tray``: the
  agent's read cycles alone (worker-thread CPU);
- cap latency: per ``set_power_limits`` that sets a cap, the time from the command reaching
  the broker's subscriber to the agent's reply (sent after every GPU's read-back matched:
  ``state.confirmed``), percentiles over the run; ``cap_change_latency_s`` only the commands
  that changed a tray's caps (racky's 20 s refreshes of the same caps confirm at once).

``python -m harness.vrack_agent_run --duration-s 600`` prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.servers import free_port, start_mosquitto
from rackplane.clock import SYSTEM_CLOCK
from rackplane.io.mqtt import MqttLink
from rackplane.io.mqtt.queues import Message
from rackplane.settings import Identity, ModbusTargetSettings, MqttSettings
from racky.app import Racky
from racky.config import RackyConfig

__all__ = ["RunFigures", "run"]

BUDGET_W = 100_000.0
"""racky's rack budget, W: below the load of ``load-step-short`` after its step, so racky
caps every tray."""


@dataclass
class RunFigures:
    """What one run measured (module docstring)."""

    duration_s: float
    trays: int = 0
    tray_messages: int = 0
    tray_messages_with_ports: int = 0
    """Tray messages whose every GPU carried its link ports (the fabric's, `SimLinks`)."""
    refused_tray_messages: int = 0
    refused_commands: int = 0
    commands_ok: int = 0
    unreadable_reply_states: int = 0
    cap_commands: int = 0
    cap_commands_confirmed: int = 0
    cap_latency_s: list[float] = field(default_factory=list)
    cap_change_latency_s: list[float] = field(default_factory=list)
    agent_cpu_core_per_tray: float | None = None
    agent_read_cpu_core_per_tray: float | None = None
    child: dict[str, Any] = field(default_factory=dict)
    enforced_gpu_caps_w: list[float] = field(default_factory=list)
    ignored_fields: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The figures with the latency as percentiles (s)."""
        d = asdict(self)
        for key in ("cap_latency_s", "cap_change_latency_s"):
            lat = sorted(d[key])
            d[key] = None if not lat else {
                "n": len(lat), "median": round(statistics.median(lat), 3),
                "p95": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 3),
                "max": round(lat[-1], 3)}
        return d


class _CommandWatch:
    """Every ``set_power_limits`` to the agents and its reply, by request id."""

    def __init__(self) -> None:
        self.sent: dict[str, tuple[float, dict[str, Any]]] = {}
        self.replies: dict[str, tuple[float, dict[str, Any]]] = {}
        self.trays: dict[int, dict[str, Any]] = {}
        self.tray_messages = 0
        self.with_ports = 0

    def on_command(self, msg: Message) -> None:
        now = time.monotonic()
        try:
            body = msg.json()
        except ValueError:
            return
        if not isinstance(body, dict) or not isinstance(body.get("request_id"), str):
            return
        if msg.topic.endswith("/result"):
            self.replies.setdefault(body["request_id"], (now, body))
        else:
            self.sent.setdefault(body["request_id"], (now, body))

    def on_tray(self, msg: Message) -> None:
        try:
            body = msg.json()
        except ValueError:
            return
        if isinstance(body, dict) and isinstance(body.get("tray"), int):
            self.tray_messages += 1
            gpus = body.get("gpus")
            if isinstance(gpus, list) and gpus and all(
                    isinstance(g, dict) and isinstance(g.get("ports"), dict) for g in gpus):
                self.with_ports += 1
            self.trays[body["tray"]] = body


async def run(duration_s: float, workdir: Path, broker_port: int | None = None
              ) -> RunFigures:
    """One run of ``duration_s`` (>= 30 s: the scenario's load step is at 10 s) in
    ``workdir``, through the Mosquitto on ``broker_port`` (None: one started here); returns
    the figures.

    Raises:
        harness.servers.ServerMissing: no mosquitto binary.
        RuntimeError: the agent's process exited early or wrote no figures.
    """
    broker = start_mosquitto(workdir) if broker_port is None else None
    port = broker.port if broker is not None else broker_port
    assert port is not None
    rack = f"r{uuid.uuid4().hex[:10]}"
    ident = Identity(rack=rack)
    base = f"rackplane/{ident.site}/{rack}"
    mq = MqttSettings(port=port, clean_session=True, reconnect_min_s=0.1,
                      reconnect_max_s=1.0)
    shelf_port = free_port()
    figures_path = workdir / "agent-figures.json"
    child_log = (workdir / "simagent.log").open("ab")
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "harness.simagent", "--mqtt-port", str(port),
        "--rack", rack, "--shelf-port", str(shelf_port), "--duration-s",
        str(duration_s + 600.0), "--epoch-file", str(workdir / "epochs.json"),
        "--spool-dir", str(workdir / "tray-agent-spool"),
        "--figures", str(figures_path), stdout=child_log, stderr=child_log)
    watch = _CommandWatch()
    link = MqttLink(MqttSettings(port=port, clean_session=True,
                                 client_id=f"vrack-watch-{rack}"), ident, "watch",
                    clock=SYSTEM_CLOCK)
    link.subscribe(f"{base}/trays/cmd/#", watch.on_command, qos=1)
    link.subscribe(f"{base}/trays/telemetry/+", watch.on_tray, qos=0)
    stop = asyncio.Event()
    out = RunFigures(duration_s=duration_s)
    link_task = asyncio.create_task(link.run())
    try:
        await link.wait_ready(10)
        cfg = RackyConfig.model_validate({
            "identity": ident.model_dump(), "mqtt": mq.model_dump(),
            "power_shelves": [ModbusTargetSettings(
                name=f"shelf{i}", port=shelf_port, unit_id=1 + i,
                register_map=Path("power-shelf"), timeout_s=1.0, reconnect_min_s=0.1,
                reconnect_max_s=1.0).model_dump() for i in range(8)],
            "power": {"budget_w": BUDGET_W},
            "node_agents": {"daemon": "trays"},
            "lifecycle": {"state_file": str(workdir / "racky-state.json")},
            "spool": {"directory": str(workdir / "spool")},
        })
        racky = Racky(cfg)
        racky_task = asyncio.create_task(racky.run(stop))
        t_end = time.monotonic() + duration_s
        while time.monotonic() < t_end:
            if child.returncode is not None:
                raise RuntimeError(f"the agent's process exited ({child.returncode}); see "
                                   f"{workdir / 'simagent.log'}")
            await asyncio.sleep(0.5)
        out.refused_tray_messages = racky.ingest.errors
        out.refused_commands = racky.agent_stats["refused"]
        out.commands_ok = racky.agent_stats["ok"]
        out.unreadable_reply_states = (racky.agent_stats["bad_reply_state"]
                                       + racky.agent_stats["legacy_replies"])
        out.ignored_fields = sorted(racky.ingest.ignored_fields)
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(racky_task, 30)
    finally:
        stop.set()
        if child.returncode is None:
            child.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(child.wait(), 30)
            if child.returncode is None:
                child.kill()
                await child.wait()
        child_log.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(link.stop(), 5)
        link_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await link_task
        if broker is not None:
            broker.stop()
    _fill(out, watch, figures_path)
    return out


def _fill(out: RunFigures, watch: _CommandWatch, figures_path: Path) -> None:
    last: dict[int, tuple[Any, Any]] = {}  # tray -> its previous caps
    for rid, (t_sent, body) in sorted(watch.sent.items(), key=lambda kv: kv[1][0]):
        args = body.get("args") or {}
        if not any(k in args for k in ("power_cap_w", "gpu_power_cap_w")):
            continue
        caps = (args.get("power_cap_w"), args.get("gpu_power_cap_w"))
        trays = [t for t in args.get("trays", []) if isinstance(t, int)]
        changed = any(last.get(t) != caps for t in trays)
        last.update(dict.fromkeys(trays, caps))
        out.cap_commands += 1
        got = watch.replies.get(rid)
        if got is None:
            continue
        t_reply, reply = got
        state = reply.get("state") or {}
        if reply.get("ok") and state.get("confirmed") is True:
            out.cap_commands_confirmed += 1
            out.cap_latency_s.append(t_reply - t_sent)
            if changed:
                out.cap_change_latency_s.append(t_reply - t_sent)
    out.tray_messages = watch.tray_messages
    out.tray_messages_with_ports = watch.with_ports
    out.enforced_gpu_caps_w = [watch.trays[k]["agent"]["enforced_gpu_cap_w"]
                               for k in sorted(watch.trays)]
    if not figures_path.exists():
        raise RuntimeError(f"the agent's process wrote no figures ({figures_path})")
    child = json.loads(figures_path.read_text())
    out.child = child
    out.trays = int(child["trays"])
    wall = float(child["wall_s"])
    if wall > 0 and out.trays:
        out.agent_cpu_core_per_tray = (child["process_cpu_s"] - child["sim_tick_cpu_s"]) \
            / out.trays / wall
        out.agent_read_cpu_core_per_tray = child["agent_read_cpu_s"] / out.trays / wall


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.vrack_agent_run", description=__doc__)
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--workdir", type=Path, default=None)
    a = p.parse_args(argv)
    if a.duration_s < 30:
        p.error("--duration-s must be >= 30")
    with tempfile.TemporaryDirectory(prefix="vrack-agent-") as tmp:
        wd = a.workdir or Path(tmp)
        wd.mkdir(parents=True, exist_ok=True)
        figs = asyncio.run(run(a.duration_s, wd))
    print(json.dumps(figs.summary(), indent=2))
    ok = figs.refused_tray_messages == 0 and figs.refused_commands == 0 \
        and figs.unreadable_reply_states == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(_main())
