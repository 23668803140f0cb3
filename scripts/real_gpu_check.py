#!/usr/bin/env python3
"""Read-only check of tray-agent on a machine with an NVIDIA GPU (issue 18 item 4).

    python scripts/real_gpu_check.py [--seconds 60] [--out real-gpu-check]

Never changes the GPU's settings: the agent runs with ``caps.dry_run = true`` (the cap path
logs what it would set: ``power_limit_dry_run``). Steps:

1. ``tray-agent --dry-connect`` with every GPU NVML sees as one tray (prints every reading);
2. a private Mosquitto (harness.servers; Debian package ``mosquitto``) and the agent publishing
   for ``--seconds`` at 1 Hz;
3. one ``set_power_limits`` (a GPU cap at the device's default limit, TTL 60 s) to exercise
   the command path in dry run;
4. every message through racky's own receive path (`racky.tick.RackyTick.message`): the
   number refused must be 0; the command's reply state must be the contract's (1.3,
   `rackplane.core.tray_reply.parse_reply_state`).

Writes ``<out>/dry-connect.txt``, ``<out>/agent.log``, ``<out>/telemetry.jsonl`` and
``<out>/summary.json``, and prints the summary. Exit 0 when the dry-connect read every GPU, at
least one message per 1.5 s was published, racky refused none and read the reply.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.servers import start_mosquitto  # noqa: E402
from rackplane.core.tray_reply import ReplyStateError, parse_reply_state  # noqa: E402
from racky.config import RackyConfig  # noqa: E402
from racky.core.controller import RackyCore  # noqa: E402
from racky.core.lifecycle import Lifecycle, PersistedState  # noqa: E402
from racky.tick import RackyTick  # noqa: E402
from trayagent.nvml import NvmlSource  # noqa: E402

BASE = "rackplane/lab/rack01/trays"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=Path("real-gpu-check"))
    a = ap.parse_args()
    out: Path = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    src = NvmlSource()
    n = src.open()
    src.close()
    if n < 1:
        print("NVML sees no GPU")
        return 1
    (out / "mosquitto").mkdir(exist_ok=True)
    mq = start_mosquitto(out / "mosquitto")
    try:
        cfg = out / "tray-agent.toml"
        cfg.write_text(f"""
[identity]
site = "lab"
row = "row1"
rack = "rack01"
[mqtt]
host = "127.0.0.1"
port = {mq.port}
[spool]
directory = "{out / 'spool'}"
[caps]
dry_run = true
epoch_file = "{out / 'epochs.json'}"
[agents]
daemon = "trays"
gpus_per_tray = {n}
[[agents.trays]]
tray = 0
nvml_devices = {list(range(n))}
coolant_out_temp_c = 45.0
""")
        agent = [sys.executable, "-m", "trayagent", "--config", str(cfg)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        dry = subprocess.run([*agent, "--dry-connect"], capture_output=True, text=True,
                             env=env, timeout=120)
        (out / "dry-connect.txt").write_text(dry.stdout + dry.stderr)
        print(dry.stdout)
        sub = subprocess.Popen(["mosquitto_sub", "-p", str(mq.port), "-t", f"{BASE}/#",
                                "-F", "%t %p"], stdout=subprocess.PIPE, text=True)
        log = (out / "agent.log").open("w")
        proc = subprocess.Popen([*agent, "--log-format", "json"], stdout=log,
                                stderr=subprocess.STDOUT, env=env)
        time.sleep(min(10.0, a.seconds / 2))
        cmd = {"request_id": uuid.uuid4().hex,
               "issued_at": datetime.now(UTC).isoformat(timespec="seconds"),
               "args": {"schema_version": "1.1", "trays": [0], "epoch": 0,
                        "gpu_power_cap_w": 10000.0, "ttl_s": 60.0}}
        subprocess.run(["mosquitto_pub", "-p", str(mq.port), "-q", "1", "-t",
                        f"{BASE}/cmd/racky/set_power_limits", "-m", json.dumps(cmd)],
                       check=True, timeout=30)
        time.sleep(max(0.0, a.seconds - min(10.0, a.seconds / 2)))
        proc.terminate()
        proc.wait(30)
        log.close()
        sub.terminate()
        lines = sub.communicate(timeout=10)[0].splitlines()
    finally:
        mq.stop()
    rc = RackyConfig.model_validate({"identity": {"site": "lab", "row": "row1",
                                                  "rack": "rack01"},
                                     "node_agents": {"daemon": "trays", "trays": 1,
                                                     "gpus_per_tray": n}})
    ps = PersistedState(Lifecycle(rc.lifecycle.initial_state, time.time_ns(), "new", "check"))
    racky = RackyTick(rc, RackyCore(rc, 0.0, ps), 0.0)
    tele = [ln.split(" ", 1) for ln in lines if " " in ln]
    trays = [(t, p) for t, p in tele if t.endswith("/telemetry/tray00")]
    with (out / "telemetry.jsonl").open("w") as fh:
        for t, p in tele:
            fh.write(json.dumps({"topic": t, "payload": p}) + "\n")
    for t, p in trays:
        racky.message(t, p.encode(), retain=False, received_mono=time.monotonic(),
                      wall_ns=time.time_ns())
    replies = [json.loads(p) for t, p in tele if t.endswith("/set_power_limits/result")]
    reply_state = "no reply"
    if replies and replies[0].get("ok") is True:
        try:
            r = parse_reply_state(replies[0].get("state"))
            reply_state = "older layout" if r.legacy else "ok"
        except ReplyStateError as err:
            reply_state = str(err)
    elif replies:
        reply_state = f"refused: {replies[0].get('error')}"
    summary = {
        "gpus": n, "dry_connect_rc": dry.returncode, "seconds": a.seconds,
        "tray_messages": len(trays), "racky_refused": racky.ingest.errors,
        "racky_stale": racky.ingest.stale_messages,
        "command_reply": replies[0] if replies else None,
        "command_reply_state": reply_state,
        "last_message": json.loads(trays[-1][1]) if trays else None,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    ok = (dry.returncode == 0 and len(trays) >= a.seconds / 1.5
          and racky.ingest.errors == 0 and racky.ingest.stale_messages == 0
          and reply_state == "ok")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
