"""The configured GPU source of the tray agent (``agents.source``)."""

from __future__ import annotations

from trayagent.config import TrayAgentConfig
from trayagent.dcgm import DcgmSource
from trayagent.nvml import NvmlSource
from trayagent.sources import GpuSource

__all__ = ["make_source"]


def make_source(cfg: TrayAgentConfig) -> GpuSource:
    """The configured GPU source (``agents.source``): the DCGM exporter or NVML."""
    if cfg.agents.source == "dcgm":
        return DcgmSource(cfg.dcgm.url, cfg.dcgm.timeout_s)
    return NvmlSource()
