"""tray-agent's configuration: one TOML file, validated at load (DESIGN §3 Config).

``tray-agent --print-default-config`` prints every key with its default and description (the
same text as ``config/tray-agent.example.toml``); ``tray-agent --check-config`` validates a
file. One process hosts the agents of the trays listed in ``[[agents.trays]]`` (one rack:
``identity``); each tray names the NVML device indices of its GPUs on this host.

Relative paths (``caps.epoch_file``) are taken inside ``$STATE_DIRECTORY`` under systemd, else
the working directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rackplane.config import (
    StrictModel,
    check_environment,
    check_state_file_dir,
    identity_required,
    load_config,
    require_keys,
)
from rackplane.config_errors import ProblemList
from rackplane.core.tray_contract import (
    AGENT_GPU_MAX_POWER_LIMIT_W,
    AGENT_SAFE_GPU_CAP_W,
    GPU_POWER_LIMIT_PLAUSIBLE_MAX_W,
)
from rackplane.paths import in_state_directory
from rackplane.settings import CommandSettings, DaemonSettings, TopicLevel, environment_checks

__all__ = ["NON_GPU_SHARE_MAX", "AgentControl", "AgentsSettings", "BmcSettings", "CapSettings",
           "DcgmSettings", "NvmlSettings", "SysfsSettings", "TrayAgentConfig", "TraySettings",
           "config_warnings", "load_tray_agent_config", "required_parts"]


NON_GPU_SHARE_MAX = 3.0
"""A tray's power outside its GPUs is at most this many times its GPUs' power at their
maximum (racky's ``node_agents.other_share`` bound; GB200 NVL72: 0.486)."""


class AgentControl(StrictModel):
    """Timing of the publish loop."""

    tick_s: float = Field(
        1.0, ge=0.1, le=60, description="publish interval, s: one telemetry/trayNN per hosted "
        "tray per interval (racky reads at 1 Hz; its node_agents.stale_after_s must exceed it)")
    read_timeout_s: float = Field(
        2.0, gt=0, le=60, description="a source read that takes longer is abandoned for this "
        "interval (its GPUs are not published; the loop never waits longer)")
    stop_budget_s: float = Field(3.0, gt=0, le=30, description="time allowed at shutdown")


class BmcSettings(StrictModel):
    """A tray's BMC over Redfish (trayagent.redfish): input power, coolant outlet temperature,
    leak detection. One session, reused; read in its own task (a slow BMC never stalls the
    publish loop)."""

    url: str = Field(pattern=r"^https?://[A-Za-z0-9._~%\-\[\]:]+(/[!-~]*)?$",
                     description="the BMC's base URL, e.g. https://tray03-bmc: http(s)://, a "
                     "host (with :port if not the default), an optional path; no spaces")
    chassis: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$",
                         description="the tray's chassis id (/redfish/v1/Chassis/<id>)")
    username: str = Field(min_length=1, max_length=64, pattern=r"^[^\x00-\x1f\x7f]+$",
                          description="BMC account (no control characters)")
    password_env: str = Field(pattern=r"^[A-Z_][A-Z0-9_]*$", description="environment "
                              "variable holding the BMC password (never in the file)")
    timeout_s: float = Field(2.0, gt=0, le=10, description="per Redfish request, s (also "
                             "bounds the logout at stop)")
    power_control: str | None = Field(
        None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Id of the chassis' power Control capped through (actuation = "
        "'redfish'); none: the chassis' Control with ControlType Power and PhysicalContext "
        "Chassis")
    set_attempts: int = Field(3, ge=1, le=10, description="most PATCHes of one cap set: a "
                              "412 Precondition Failed (written by another) re-reads and "
                              "retries")
    max_age_s: float = Field(5.0, gt=0, le=300, description="a BMC reading older than this "
                             "is not used: the tray's power falls back to the GPUs' sum + "
                             "non_gpu_power_w, the outlet to coolant_out_temp_c, and the leak "
                             "sensor is reported faulted")

    @field_validator("chassis", "power_control")
    @classmethod
    def _path_segment(cls, v: str | None) -> str | None:
        # a Redfish Id is one URL path segment: '.' or '..' would name another resource
        if v in (".", ".."):
            raise ValueError(f"{v!r} is not a Redfish Id (a path segment, not '.' or '..')")
        return v


class TraySettings(StrictModel):
    """One compute tray hosted by this process."""

    tray: int = Field(ge=0, le=63, description="tray index in the rack (0-based; topic "
                      "telemetry/trayNN)")
    nvml_devices: list[int] = Field(
        min_length=1, max_length=16, description="NVML device indices of the tray's GPUs on "
        "this host, in the tray's GPU order (rack-wide GPU = tray × gpus_per_tray + position)")
    gpu_ports: list[list[str]] = Field(
        default_factory=list, description="per GPU (in nvml_devices order) its link ports "
        "read from sysfs ('<rdma device>/<port>' or an interface), published as the GPU's "
        "port block; every GPU the same number; empty: no ports published (needs "
        "sysfs.enabled)")
    non_gpu_power_w: float = Field(
        0.0, ge=0, le=20000, description="the tray's power outside its GPUs, W (an estimate): "
        "added to the GPUs' power as the tray's input power while no BMC reading is fresh, "
        "and taken off racky's tray cap (power_cap_w) before it is shared among the GPUs "
        "until a fresh BMC reading measures it (input power − the GPUs' sum, smoothed)")
    coolant_out_temp_c: float = Field(
        ge=-10, le=100, description="reported as the tray's coolant outlet temperature while "
        "no BMC reading is fresh, °C (contract v1 requires a number; the leak sensor is then "
        "reported faulted): the loop's design outlet temperature")
    bmc: BmcSettings | None = Field(None, description="the tray's BMC (Redfish); none: power "
                                    "and outlet from the settings above, leak sensor faulted")
    actuation: Literal["nvml", "redfish"] = Field(
        "nvml", description="where the tray's cap is applied: nvml (per-GPU power limits) or "
        "redfish (the BMC's chassis power Control, a tray limit: racky's power_cap_w, a "
        "gpu_power_cap_w as GPUs × it + non_gpu_power_w; needs bmc)")

    @model_validator(mode="after")
    def _unique(self) -> TraySettings:
        if self.actuation == "redfish" and self.bmc is None:
            raise ValueError("actuation = 'redfish' needs the tray's bmc")
        if len(set(self.nvml_devices)) != len(self.nvml_devices):
            raise ValueError("nvml_devices names a device twice")
        if self.gpu_ports:
            if len(self.gpu_ports) != len(self.nvml_devices):
                raise ValueError(f"gpu_ports has {len(self.gpu_ports)} entries for "
                                 f"{len(self.nvml_devices)} GPUs")
            if len({len(p) for p in self.gpu_ports}) != 1 or not self.gpu_ports[0]:
                raise ValueError("gpu_ports: every GPU needs the same number (>= 1) of ports")
            flat = [p for ports in self.gpu_ports for p in ports]
            if len(set(flat)) != len(flat):
                raise ValueError("gpu_ports names a port twice")
        return self


class AgentsSettings(StrictModel):
    """The trays this process publishes and where (racky's [node_agents] must match)."""

    daemon: TopicLevel = Field(
        "trays", description="topic level of the agents: telemetry on <root>/<site>/<rack>/"
        "<daemon>/telemetry/trayNN, commands on <...>/<daemon>/cmd/<user>/set_power_limits "
        "(racky's node_agents.daemon)")
    source: Literal["nvml", "dcgm"] = Field(
        "nvml", description="where the GPUs are read: nvml (and capped through it) or dcgm "
        "(the exporter's /metrics: read only, caps refused, cap_enforceable = false); "
        "nvml_devices are then the exporter's gpu label values")
    gpus_per_tray: int = Field(4, ge=1, le=16, description="GPUs per tray (racky's "
                               "node_agents.gpus_per_tray)")
    trays: list[TraySettings] = Field(default_factory=list, max_length=64,
                                      description="the trays hosted by this process")

    @model_validator(mode="after")
    def _trays(self) -> AgentsSettings:
        seen: set[int] = set()
        devices: set[int] = set()
        for i, t in enumerate(self.trays):
            if t.tray in seen:
                raise ValueError(f"trays[{i}].tray {t.tray} is listed twice")
            seen.add(t.tray)
            if len(t.nvml_devices) != self.gpus_per_tray:
                raise ValueError(f"trays[{i}].nvml_devices has {len(t.nvml_devices)} devices, "
                                 f"gpus_per_tray is {self.gpus_per_tray}")
            if devices & set(t.nvml_devices):
                raise ValueError(f"trays[{i}].nvml_devices: device(s) "
                                 f"{sorted(devices & set(t.nvml_devices))} already on another "
                                 "tray")
            devices |= set(t.nvml_devices)
        return self


class NvmlSettings(StrictModel):
    """GPUs through NVML (nvidia-ml-py, libnvidia-ml.so.1)."""

    enabled: bool = Field(True, description="read the GPUs through NVML (agents.source = "
                          "'nvml')")


class DcgmSettings(StrictModel):
    """GPUs through NVIDIA's DCGM exporter (agents.source = 'dcgm'): read only, the trays
    report cap_enforceable = false and refuse caps."""

    url: str = Field("http://127.0.0.1:9400/metrics", pattern=r"^https?://",
                     description="the exporter's metrics URL")
    timeout_s: float = Field(0.5, gt=0, le=30, description="HTTP timeout of one scrape, s "
                             "(below control.read_timeout_s)")


class SysfsSettings(StrictModel):
    """RDMA / Ethernet counters from the kernel's sysfs (trayagent.sysfs): printed by
    ``--dry-connect``, published as the port blocks of the GPUs that name ports
    (agents.trays[].gpu_ports)."""

    enabled: bool = Field(False, description="read the link counters")
    ports: list[str] = Field(
        default_factory=list, max_length=256, description="ports to read: '<rdma device>/"
        "<port>' (e.g. mlx5_0/1) or an interface (eth0); empty: every port found")
    publish_counters: list[str] = Field(
        default_factory=list, max_length=64, description="counters published in the port "
        "blocks (racky's links.counters must be among them); empty: every counter all ports "
        "of a GPU have, of the contract's widths (8, 16, 32, 64 bits)")
    ib_extended_counters: bool = Field(
        True, description="the HCAs have PortCountersExtended (64-bit port_xmit_data and "
        "packet counters; every ConnectX); false: the 32-bit fallback, which saturates")
    root: Path = Field(Path("/sys"), description="sysfs mount point (tests use a tree in a "
                       "temporary folder)")
    max_rate_per_s: float = Field(
        1e12, gt=0, description="largest plausible rate of any counter, counts/s: a decrease "
        "whose wrapped difference exceeds rate × elapsed is a reset, not a wrap")


class CapSettings(StrictModel):
    """Per-GPU power caps through NVML (node-agent contract v1 set_power_limits)."""

    gpu_max_power_limit_w: float = Field(
        AGENT_GPU_MAX_POWER_LIMIT_W, gt=0, le=GPU_POWER_LIMIT_PLAUSIBLE_MAX_W,
        description="the highest power limit this host's GPUs accept, W (NVML's maximum "
        "power limit, printed by --dry-connect as max_w; B200 1200, GB300 1400): the bound "
        "of every per-GPU cap and limit in this file (safe_gpu_cap_w; each tray's "
        "non_gpu_power_w is bounded by it too): above it a value is refused at --check-config "
        "instead of being clamped to the device later")
    safe_gpu_cap_w: float = Field(
        AGENT_SAFE_GPU_CAP_W, gt=0, allow_inf_nan=False,
        description="per-GPU limit held from the start until racky's first command and "
        "whenever racky's caps expire (its TTL ran out: racky silent), W; never uncapped. At "
        "most gpu_max_power_limit_w; clamped into each device's [min, max] limits (logged "
        "safe_gpu_cap_clamped); stated in the telemetry (agent.safe_gpu_cap_w). In a fleet, "
        "at most racky's [fleet] agent_safe_gpu_cap_w (the same default): rlc counts on a "
        "silent rack's trays drawing no more")
    dry_run: bool = Field(
        False, description="never set a limit: log what would be set (read-only checks on a "
        "real GPU)")
    tolerance_w: float = Field(
        1.0, gt=0, le=100, description="a read-back limit within this of the target is "
        "enforced, W (NVML rounds to its own step)")
    confirm_timeout_s: float = Field(
        2.0, gt=0, le=30, description="how long a command waits for the read-back before it "
        "answers (the reply says whether every GPU was confirmed), s")
    epoch_file: Path = Field(
        Path("tray-agent-epochs.json"), description="the newest command epoch per tray, "
        "persisted (a restarted agent still refuses older commands)")

    @model_validator(mode="after")
    def _within_the_gpus(self) -> CapSettings:
        if self.safe_gpu_cap_w > self.gpu_max_power_limit_w:
            raise ValueError(
                f"safe_gpu_cap_w = {self.safe_gpu_cap_w:g} W is above gpu_max_power_limit_w = "
                f"{self.gpu_max_power_limit_w:g} W, the highest limit this host's GPUs accept: "
                "the GPUs would be clamped to their maximum, not held at a safe cap (W, not "
                "kW? if the GPUs accept more, raise gpu_max_power_limit_w to their max_w)")
        if self.tolerance_w >= self.safe_gpu_cap_w:
            raise ValueError(
                f"tolerance_w = {self.tolerance_w:g} W is not below safe_gpu_cap_w = "
                f"{self.safe_gpu_cap_w:g} W: any read-back would count as the safe cap enforced")
        return self


def _default_commands() -> CommandSettings:
    return CommandSettings(users={"racky": "automation"})


class TrayAgentConfig(DaemonSettings):
    """The whole tray-agent config file."""

    @classmethod
    def example_values(cls) -> dict[str, Any]:
        """``--print-default-config``'s example tray (`rackplane.config.EXAMPLE_VALUES_HOOK`):
        the defaults host none, and a config must list its trays (`required_parts`)."""
        return {"agents": {"trays": [{"tray": 0, "nvml_devices": [0, 1, 2, 3],
                                      "coolant_out_temp_c": 45.0}]}}

    control: AgentControl = AgentControl()
    agents: AgentsSettings = AgentsSettings()
    nvml: NvmlSettings = NvmlSettings()
    dcgm: DcgmSettings = DcgmSettings()
    sysfs: SysfsSettings = SysfsSettings()
    caps: CapSettings = CapSettings()
    commands: CommandSettings = Field(
        default_factory=_default_commands,
        description="command path: roles of broker users (racky = automation: "
        "set_power_limits)")

    @model_validator(mode="after")
    def _ports_need_sysfs(self) -> TrayAgentConfig:
        if any(t.gpu_ports for t in self.agents.trays) and not self.sysfs.enabled:
            raise ValueError("agents.trays[].gpu_ports needs sysfs.enabled = true")
        return self

    @model_validator(mode="after")
    def _non_gpu_power_plausible(self) -> TrayAgentConfig:
        # racky's node_agents.other_share is at most 3: a tray's non-GPU power above three
        # times its GPUs at their maximum is a typo, and it would take all of racky's tray
        # cap from the GPUs (each then clamped to its device minimum)
        most = NON_GPU_SHARE_MAX * self.agents.gpus_per_tray * self.caps.gpu_max_power_limit_w
        for i, t in enumerate(self.agents.trays):
            if t.non_gpu_power_w > most:
                raise ValueError(
                    f"agents.trays[{i}].non_gpu_power_w = {t.non_gpu_power_w:g} W is above "
                    f"{most:g} W ({NON_GPU_SHARE_MAX:g} × gpus_per_tray × "
                    "caps.gpu_max_power_limit_w): not a tray's CPUs, NICs and fans")
        return self


def required_parts(data: Mapping[str, Any]) -> list[str]:
    """What a tray agent cannot run without, judged on the file's own keys
    (`rackplane.config.RequiredCheck`): its identity (`rackplane.config.identity_required`)
    and the trays it hosts (``agents.trays``, at least one: an agent with none publishes
    nothing)."""
    out = require_keys(data, identity_required("tray-agent"))
    agents = data.get("agents")
    trays = agents.get("trays") if isinstance(agents, Mapping) else None
    if not trays:
        out.append("agents.trays: lists no tray: this agent would publish nothing; add "
                   "[[agents.trays]] with tray, nvml_devices and coolant_out_temp_c")
    return out


def _no_source(cfg: TrayAgentConfig) -> str | None:
    """Why the agent has nothing to read (no GPU source and no BMC), or None."""
    if cfg.agents.source != "nvml" or cfg.nvml.enabled:
        return None
    if any(t.bmc is not None for t in cfg.agents.trays):
        return None
    return ("nvml.enabled: false with agents.source = 'nvml' and no tray has a bmc: the agent "
            "has no GPU source and no BMC, nothing to read; enable NVML, use source 'dcgm', "
            "or give the trays their bmc")


def config_warnings(cfg: TrayAgentConfig) -> list[str]:
    """What is unusual but not fatal (``--check-config`` prints it, the agent logs it at
    start): the GPUs not read (NVML off, a BMC the only source: no per-GPU figures, no caps
    applied through NVML), and trays without a BMC (their outlet temperature is the
    configured constant and their leak sensor is reported faulted)."""
    out = []
    if cfg.agents.source == "nvml" and not cfg.nvml.enabled:
        out.append("nvml.enabled is false with agents.source = 'nvml': the GPUs are not read "
                   "(only the trays' BMCs): no per-GPU power or temperature, no NVML caps")
    no_bmc = [t.tray for t in cfg.agents.trays if t.bmc is None]
    if no_bmc:
        out.append(f"trays {no_bmc} have no bmc: their coolant outlet is the configured "
                   "coolant_out_temp_c and their leak sensor is reported faulted (racky cannot "
                   "see a leak there)")
    return out


def load_tray_agent_config(path: str | os.PathLike[str] | None) -> TrayAgentConfig:
    """Load and validate the config; the file must name the agent's identity and trays
    (`required_parts`), and it must have something to read (a GPU source or a BMC); the
    epoch file's folder must be usable.

    Raises:
        ConfigError: naming the key path.
    """
    problems = ProblemList()  # every problem at once (rackplane.config_errors)
    cfg = load_config(TrayAgentConfig, path, required=required_parts,
                      example="config/tray-agent.example.toml", problems=problems)
    if (why := _no_source(cfg)) is not None:
        problems.add(why)
    with problems.check():
        check_state_file_dir("caps.epoch_file", in_state_directory(cfg.caps.epoch_file))
    with problems.check():
        check_environment({
            **environment_checks(cfg.mqtt, cfg.tsdb),
            **{f"agents.trays[{i}].bmc.password_env": t.bmc.password_env
               for i, t in enumerate(cfg.agents.trays) if t.bmc is not None}})
    problems.raise_if_any()
    return cfg
