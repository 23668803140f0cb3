"""systemd/tray-agent.service verifies, keeps exposure <= 2.0 like the other daemons' units,
and has what the agent needs (the NVIDIA device nodes, its state directory for the epoch
file). Checked as a copy whose ExecStart is /bin/true (the console script need not be
installed in this environment)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.unit.test_systemd_units import ANALYZE, UNITS, _directives, exposure, needs_analyze
from trayagent.config import TrayAgentConfig


def _copy(tmp_path: Path) -> Path:
    text = (UNITS / "tray-agent.service").read_text()
    assert "/opt/rackplane/bin/tray-agent " in text
    dst = tmp_path / "tray-agent.service"
    dst.write_text(text.replace("/opt/rackplane/bin/tray-agent ", "/bin/true "))
    return dst


@needs_analyze
def test_unit_verifies_and_exposure_at_most_2(tmp_path: Path) -> None:
    assert ANALYZE is not None
    unit = _copy(tmp_path)
    res = subprocess.run([ANALYZE, "verify", "--man=no", str(unit)], capture_output=True,
                         text=True, timeout=60)
    ours = [ln for ln in (res.stdout + res.stderr).splitlines() if "tray-agent.service" in ln]
    assert res.returncode == 0 and not ours, res.stdout + res.stderr
    assert exposure(unit) <= 2.0


def test_unit_contract() -> None:
    d = _directives("tray-agent")
    assert (d["Type"], d["NotifyAccess"], d["Restart"]) == (["notify"], ["main"],
                                                            ["on-failure"])
    cfg = TrayAgentConfig()
    assert float(d["TimeoutStopSec"][0]) > cfg.tsdb.stop_budget_s + cfg.control.stop_budget_s
    assert float(d["WatchdogSec"][0]) > 0
    assert d["StateDirectory"] == ["rackplane-tray-agent"]
    assert d["ExecStart"][0].split()[1:] == ["--config", "/etc/rackplane/tray-agent.toml"]
    assert {"/dev/nvidiactl rw", "char-nvidia-frontend rw"} <= set(d["DeviceAllow"])
    assert d["DevicePolicy"] == ["closed"] and d["ProtectSystem"] == ["strict"]
