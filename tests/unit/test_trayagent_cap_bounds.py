"""tray-agent's per-GPU cap and limit settings are bounded by the GPUs they set
(``caps.gpu_max_power_limit_w``, default `AGENT_GPU_MAX_POWER_LIMIT_W`): ``safe_gpu_cap_w =
5000`` was accepted (inside a static 5 kW bound) and then silently clamped to the device.
Refused at config check: a safe cap above the GPUs' maximum, a tolerance not below the safe
cap, a tray's non-GPU power above 3 × its GPUs at their maximum; a safe cap the device still
clamps (its own maximum is lower) is logged at start (``safe_gpu_cap_clamped``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from structlog.testing import capture_logs
from typer.testing import CliRunner

from rackplane.core.tray_contract import (
    AGENT_GPU_MAX_POWER_LIMIT_W,
    AGENT_SAFE_GPU_CAP_W,
    GPU_POWER_LIMIT_PLAUSIBLE_MAX_W,
)
from trayagent.config import NON_GPU_SHARE_MAX, TrayAgentConfig

TRAY = {"tray": 3, "nvml_devices": [0, 1, 2, 3], "coolant_out_temp_c": 45.0}


def _cfg(caps: dict[str, Any], **tray: Any) -> TrayAgentConfig:
    return TrayAgentConfig.model_validate({"caps": caps,
                                           "agents": {"trays": [{**TRAY, **tray}]}})


def test_the_defaults_agree() -> None:
    c = TrayAgentConfig().caps
    assert (c.safe_gpu_cap_w, c.gpu_max_power_limit_w) == (AGENT_SAFE_GPU_CAP_W,
                                                           AGENT_GPU_MAX_POWER_LIMIT_W)
    assert AGENT_SAFE_GPU_CAP_W <= AGENT_GPU_MAX_POWER_LIMIT_W <= GPU_POWER_LIMIT_PLAUSIBLE_MAX_W


@pytest.mark.parametrize("safe_w", [5000.0, AGENT_GPU_MAX_POWER_LIMIT_W + 1.0])
def test_a_safe_cap_above_the_gpus_maximum_is_refused(safe_w: float) -> None:
    with pytest.raises(ValidationError, match=r"safe_gpu_cap_w = \S+ W is above "
                       r"gpu_max_power_limit_w = 1200 W"):
        _cfg({"safe_gpu_cap_w": safe_w})
    assert _cfg({"safe_gpu_cap_w": AGENT_GPU_MAX_POWER_LIMIT_W}).caps.safe_gpu_cap_w == 1200.0


def test_gpus_that_accept_more_say_so() -> None:
    got = _cfg({"safe_gpu_cap_w": 1300.0, "gpu_max_power_limit_w": 1400.0})
    assert got.caps.safe_gpu_cap_w == 1300.0
    with pytest.raises(ValidationError, match="gpu_max_power_limit_w"):
        _cfg({"gpu_max_power_limit_w": GPU_POWER_LIMIT_PLAUSIBLE_MAX_W + 1.0})
    with pytest.raises(ValidationError, match="safe_gpu_cap_w = 3001 W is above"):
        _cfg({"safe_gpu_cap_w": GPU_POWER_LIMIT_PLAUSIBLE_MAX_W + 1.0,
              "gpu_max_power_limit_w": GPU_POWER_LIMIT_PLAUSIBLE_MAX_W})


def test_a_tolerance_as_large_as_the_safe_cap_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"tolerance_w = 100 W is not below "
                       r"safe_gpu_cap_w = 100 W"):
        _cfg({"safe_gpu_cap_w": 100.0, "tolerance_w": 100.0})
    assert _cfg({"safe_gpu_cap_w": 100.0, "tolerance_w": 99.0}).caps.tolerance_w == 99.0


def test_a_trays_non_gpu_power_is_bounded_by_its_gpus() -> None:
    most = NON_GPU_SHARE_MAX * 4 * AGENT_GPU_MAX_POWER_LIMIT_W  # 14.4 kW
    assert _cfg({}, non_gpu_power_w=most).agents.trays[0].non_gpu_power_w == most
    with pytest.raises(ValidationError, match=r"agents.trays\[0\].non_gpu_power_w = 20000 W "
                       r"is above 14400 W"):
        _cfg({}, non_gpu_power_w=20000.0)  # inside the field's own 20 kW bound


def test_check_config_refuses_the_safe_cap_naming_both_settings(tmp_path: Path) -> None:
    from trayagent.cli import app

    cfg = tmp_path / "tray-agent.toml"
    cfg.write_text("[caps]\nsafe_gpu_cap_w = 5000\n")
    r = CliRunner().invoke(app, ["--config", str(cfg), "--check-config"],
                           env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output
    assert "safe_gpu_cap_w = 5000 W is above gpu_max_power_limit_w = 1200 W" in \
        " ".join(r.stderr.split()), r.stderr


def test_a_safe_cap_the_device_clamps_is_logged_once(tmp_path: Path) -> None:
    from trayagent.app import TrayAgent
    from trayagent.core.caps import DeviceLimits
    from trayagent.core.payload import GpuReading

    cfg = TrayAgentConfig.model_validate({
        "spool": {"directory": str(tmp_path / "spool")},
        "caps": {"epoch_file": str(tmp_path / "epochs.json"), "safe_gpu_cap_w": 1000.0},
        "agents": {"trays": [TRAY]}})
    agent = TrayAgent(cfg)
    for i, g in enumerate(agent.gpus[3]):  # an H100-like device: 700 W at most; GPU 0 1.2 kW
        g.reading = GpuReading(gpu=g.gpu, limits=DeviceLimits(200.0, 1200.0 if i == 0 else 700.0,
                                                               700.0))
    with capture_logs() as logs:
        targets = agent._targets([3])
        agent._targets([3])  # the same clamp again: not logged again
    assert [t.watts for t in targets.values()] == [1000.0, 700.0, 700.0, 700.0]
    said = [e for e in logs if e["event"] == "safe_gpu_cap_clamped"]
    assert [(e["gpu"], e["held_w"], e["safe_gpu_cap_w"]) for e in said] == [
        (13, 700.0, 1000.0), (14, 700.0, 1000.0), (15, 700.0, 1000.0)], said
    assert all("above the device maximum 700 W" in e["reason"] for e in said)
    assert all(e["log_level"] == "warning" for e in said)
