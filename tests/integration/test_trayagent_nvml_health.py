"""NVLink error counters, ECC totals and Xid events through nvidia-ml-py's real ctypes path
over the stand-in ``libnvidia-ml.so.1`` (tests/standin/nvml_standin.c): what NVML answers is
what the agent reads (links that do not exist are skipped, ECC off is a reason, not a 0), an
Xid written while the watch waits is delivered for a watched device only, and the running
agent logs it (``gpu_xid``) with its tray and rack-wide GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.daemons import daemon_proc, until
from harness.servers import Mosquitto
from tests.adapters.mqtt_cli import MqttSub
from tests.integration.test_trayagent_nvml import _config, _env
from tests.standin.build import build_nvml_standin

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys, time
from trayagent.nvml import NvmlSource
s = NvmlSource()
n = s.open()
health = []
for i in range(n):
    h = s.read_health(i)
    health.append({"links": [[l.link, l.active, l.counters] for l in h.links],
                   "ecc": [h.ecc_corrected_volatile, h.ecc_uncorrected_volatile,
                           h.ecc_corrected_aggregate, h.ecc_uncorrected_aggregate],
                   "errors": h.errors})
w = s.xid_watch([0, 1, 2])
events = []
xid_file = sys.argv[1]
if xid_file != "-":
    t0 = time.monotonic()
    while not events and time.monotonic() - t0 < 5:
        events += w.wait(100)
    with open(xid_file, "a") as f:  # a second Xid written while the watch runs
        f.write("2 94\n")
    t0 = time.monotonic()
    while len(events) < 2 and time.monotonic() - t0 < 5:
        events += w.wait(100)
    events += w.wait(100)  # nothing more: device 3 is not watched
w.close()
s.close()
print(json.dumps({"n": n, "health": health, "xid": [list(e) for e in events],
                  "unsupported": {str(k): v for k, v in w.unsupported.items()}}))
"""


def _run(lib: Path, xid_file: str, **env: str) -> dict[str, Any]:
    e = {**os.environ, "LD_LIBRARY_PATH": str(lib), "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]), **env}
    if xid_file != "-":
        e["STANDIN_NVML_XID_FILE"] = xid_file
    out = subprocess.run([sys.executable, "-c", SCRIPT, xid_file], env=e, check=True,
                         capture_output=True, text=True, timeout=60)
    return dict(json.loads(out.stdout))


def test_nvlink_ecc_and_xid_read_through_nvml(tmp_path: Path) -> None:
    lib = build_nvml_standin(tmp_path / "lib")
    xid = tmp_path / "xid"
    xid.write_text("3 48\n1 79\n")  # device 3 is not watched: only 1's Xid 79 comes
    r = _run(lib, str(xid), STANDIN_NVML_NVLINKS="3", STANDIN_NVML_NVLINK_ERRORS="10",
             STANDIN_NVML_ECC_CORRECTED="7", STANDIN_NVML_ECC_UNCORRECTED="2")
    assert r["n"] == 4
    h1 = r["health"][1]
    # counter c of link l on device d reads 10 (l + 1)(c + 1) + d (the stand-in's rule)
    assert [ln[0] for ln in h1["links"]] == [0, 1, 2] and all(ln[1] for ln in h1["links"])
    assert h1["links"][2][2] == {"replay": 31, "recovery": 61, "crc_flit": 91,
                                 "crc_data": 121, "ecc_data": 151}
    assert h1["ecc"] == [8, 3, 16, 6] and h1["errors"] == {}
    assert r["xid"] == [[1, 79], [2, 94]] and r["unsupported"] == {}


def test_no_nvlink_ecc_off_and_no_xid_are_reasons(tmp_path: Path) -> None:
    lib = build_nvml_standin(tmp_path / "lib")
    r = _run(lib, "-", STANDIN_NVML_NVLINKS="0", STANDIN_NVML_ECC="0")
    h0 = r["health"][0]
    assert h0["links"] == [] and h0["ecc"] == [None] * 4
    assert h0["errors"]["ecc_corrected_volatile"] == "Not Supported"
    assert r["xid"] == [] and set(r["unsupported"]) == {"0", "1", "2"}


@pytest.mark.servers
async def test_the_agent_logs_an_xid_of_a_hosted_gpu(tmp_path: Path,
                                                     mosquitto: Mosquitto) -> None:
    lib = build_nvml_standin(tmp_path / "lib")
    xid = tmp_path / "xid"
    xid.write_text("")
    cfg = _config(tmp_path, mosquitto.port)
    agent = daemon_proc("trayagent", tmp_path, cfg, tag="xid",
                        env=_env(lib, STANDIN_NVML_XID_FILE=str(xid),
                                 STANDIN_NVML_ECC_CORRECTED="5",
                                 STANDIN_NVML_ECC_UNCORRECTED="1")).start()
    topic = "rackplane/lab/rack01/trays/telemetry/tray03"
    try:
        async with MqttSub(mosquitto.port, topic, v5=False) as sub:
            await sub.wait_for(lambda m: True, 15.0)  # publishing: NVML is open
            with xid.open("a") as f:  # read by the watch once NVML is open
                f.write("2 79\n")
            found: list[dict[str, Any]] = []

            def seen() -> bool:
                found[:] = [e for e in agent.events() if e.get("event") == "gpu_xid"]
                return bool(found)

            await until(seen, 15.0, "the Xid logged", agent)
            # tray 3, device 2: rack-wide GPU 3 x 4 + 2
            assert (found[0]["device"], found[0]["xid"], found[0]["tray"], found[0]["gpu"]) \
                == (2, 79, 3, 14)
            # contract 1.2: the Xid in the GPU's next message (once), its total kept; the
            # ECC volatile totals (the stand-in's: N + device)
            msg = await sub.wait_for(
                lambda m: json.loads(m.payload)["gpus"][2]["xids"] == [79], 15.0)
            gpus = json.loads(msg.payload)["gpus"]
            assert [(g["gpu"], g["xid_total"]) for g in gpus] == \
                [(12, 0), (13, 0), (14, 1), (15, 0)]
            assert [(g["ecc_corrected_volatile"], g["ecc_uncorrected_volatile"])
                    for g in gpus] == [(5, 1), (6, 2), (7, 3), (8, 4)]
            n = len(sub.messages)
            nxt = await sub.wait_for(lambda m: True, 15.0, n)
            g14 = json.loads(nxt.payload)["gpus"][2]
            assert (g14["xid_total"], g14["xids"]) == (1, [])
        assert agent.stop() == 0
    finally:
        agent.stop()
