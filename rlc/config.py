"""rlc's config file (TOML; `RlcConfig`): the shared daemon sections, the topology with its
limits (`rlc.core.topology`), lease timing (`rlc.core.leases.LeaseTiming`), allocation
settings, the fleet KV bucket (``[fleet]``) and ``[leadership]`` (2–3 replicas, one leads:
`rackplane.leadership_settings`). Errors name the key path (`rackplane.config.load_config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationInfo, model_validator

from rackplane.config import REQUIRED_CHECKED, StrictModel
from rackplane.core.budget_leases import DEFAULT_RACK_FLOOR_W
from rackplane.core.tray_contract import RACKY_CAP_TTL_S
from rackplane.leadership_settings import LeadershipSettings, NatsKvSettings
from rackplane.settings import CommandSettings, DaemonSettings, Identity, TopicLevel
from rlc.core.allocation import AllocationSettings
from rlc.core.campaign_size import DEFAULT_MAX_RECORD_BYTES
from rlc.core.leases import LeaseTiming
from rlc.core.topology import TopologySettings

__all__ = ["EXAMPLE_CONFIG", "CampaignSettings", "FleetKvSettings", "RlcConfig", "RlcControl",
           "example_topology", "required_parts"]


class RlcControl(StrictModel):
    """Timing of rlc's tick (state publication) and stop."""

    tick_s: float = Field(1.0, ge=0.1, le=10, description="tick (state/fleet publication), s")
    state_interval_s: float = Field(2.0, gt=0, le=600, description="retained state/fleet, s")
    stop_budget_s: float = Field(3.0, gt=0, le=30, description="time allowed at shutdown")
    telemetry_interval_s: float = Field(
        1.0, ge=0.1, le=600, allow_inf_nan=False,
        description="the fleet's time series (fleet_rack, fleet_row; rlc/telemetry.py) are "
        "written this often while leading, s (a line per rack and row: ~36 ms a write at "
        "1,000 racks, measured; raise it on a large fleet)")


class FleetKvSettings(NatsKvSettings):
    """The KV bucket of budget leases and rack reports (`rackplane.core.budget_leases`)."""

    bucket: str = Field("rackplane_fleet", pattern=r"^[A-Za-z0-9_-]{1,64}$",
                        description="the KV bucket of budget leases and rack reports (made "
                        "when missing); racky's [fleet] bucket must name the same")
    cycle_s: float = Field(1.0, ge=0.1, le=60, allow_inf_nan=False,
                           description="allocation cycle: reports read, leases written")
    unreachable_after_s: float = Field(
        5.0, gt=0, le=3600, allow_inf_nan=False,
        description="a rack whose report has not changed this long is unreachable: its grant "
        "is held (never raised)")
    reclaim_after_s: float = Field(
        15.0, gt=0, le=86400, allow_inf_nan=False,
        description="unreachable this long, its grant is lowered to its floor (the old grant "
        "stays committed until its lease expiry + clock margin + agent cap TTL)")
    write_deadband_w: float = Field(100.0, ge=0, le=1e6, allow_inf_nan=False,
                                    description="a grant change smaller than this is not "
                                    "written (leases are still renewed at ttl_s / 3)")
    cooling_max_w: float = Field(
        1_000_000.0, gt=0, le=1e9, allow_inf_nan=False,
        description="a rack's reported cooling capacity (racky: valvey's measurement) above "
        "this is implausible and not used, W (racky's power.rack_capacity_w plausibility: "
        "≤ 1 MW a rack); a plausible one caps the rack at the lower of it and the topology's "
        "cooling_capacity_w")
    cooling_hold_s: float = Field(
        300.0, ge=0, le=86400, allow_inf_nan=False,
        description="a rack's last plausible reported cooling capacity is kept this long once "
        "its report is stale, lacks it or is implausible, s; then the topology's "
        "cooling_capacity_w alone applies (none configured: no cooling limit)")

    @model_validator(mode="after")
    def _check(self) -> FleetKvSettings:
        if self.reclaim_after_s < self.unreachable_after_s:
            raise ValueError(f"reclaim_after_s ({self.reclaim_after_s}) must be >= "
                             f"unreachable_after_s ({self.unreachable_after_s})")
        return self


class CampaignSettings(StrictModel):
    """``[campaign]``: validation campaigns (issue 17; rlc/campaign_driver.py): whom rlc's
    orders to racky come from and how often unconfirmed ones are sent again."""

    user: TopicLevel | None = Field(
        None, description="the MQTT user rlc's orders to racky go out as (cmd/<user>/...); "
        "racky's [campaign_gate] controller_user must name it (None: mqtt.username, else "
        "'rlc')")
    racky_daemon: TopicLevel = Field("racky", description="racky's daemon topic level")
    resend_s: float = Field(10.0, ge=1, le=600, allow_inf_nan=False,
                            description="orders not yet confirmed by racky's state are sent "
                            "again this often, s (each carries its run id: started once)")
    max_record_bytes: int = Field(
        DEFAULT_MAX_RECORD_BYTES, ge=16_384, le=64 * 1_048_576,
        description="the campaign record's bound, bytes: the NATS servers' max_payload (default "
        "1 MiB) less room for the KV headers; a plan whose record could exceed it is refused, "
        "and a record above it is never written (rlc/core/campaign_size.py)")


EXAMPLE_CONFIG = "config/rlc.example.toml"
"""Where the shipped example (its ``[topology]`` commented out) is: errors point at it."""


def example_topology() -> TopologySettings:
    """An EXAMPLE only (never used as a default: rlc budgets only what the operator
    configured): one hall, one row of two racks, each with the shared default floor
    (`rackplane.core.budget_leases.DEFAULT_RACK_FLOOR_W`, racky's ``[fleet] floor_w``
    default), no configured cooling capacity. ``rlc --print-default-config`` writes it
    commented out; tests use it as a small fleet."""
    rack: dict[str, Any] = {"floor_w": DEFAULT_RACK_FLOOR_W, "max_w": 132_000.0,
                            "priority": "normal"}
    return TopologySettings.model_validate({
        "site": "lab", "halls": {"hall1": {"feed_limit_w": 400_000.0, "rows": {"row1": {
            "limit_w": 200_000.0, "ramp_w_per_s": 20_000.0,
            "racks": {"rack1": rack, "rack2": dict(rack)}}}}}})


def required_parts(data: Mapping[str, Any]) -> list[str]:
    """What rlc cannot run without, judged on the file's own keys
    (`rackplane.config.RequiredCheck`): its ``[topology]`` with halls (`_no_topology`)."""
    why = _no_topology(dict(data))
    return [] if why is None else [f"topology: {why}"]


def _no_topology(data: object) -> str | None:
    """Why ``data`` (the raw config mapping) gives rlc no topology to budget, or None."""
    if not isinstance(data, dict):
        return None  # pydantic names the type
    topo = data.get("topology")
    if topo is None or topo == {}:
        what = "there is no [topology] section" if topo is None else "[topology] is empty"
    elif isinstance(topo, dict) and not topo.get("halls"):
        what = "[topology] names no halls (with their rows and racks)"
    else:
        return None
    return (f"{what}: rlc budgets only the racks the operator configured, never a built-in "
            "example. Write [topology] with its site and halls → rows (limit_w) → racks "
            f"(floor_w, max_w); see the commented example in {EXAMPLE_CONFIG} (commented out "
            "on purpose, so that file alone is refused too: copy it, uncomment [topology] and "
            "write your own site, rows and racks)")


class RlcConfig(DaemonSettings):
    """The whole rlc config file."""

    identity: Identity = Field(default_factory=lambda: Identity(row="fleet", rack="rlc"),
                               description="topic levels: rackplane/<site>/<rack>/rlc/...; "
                               "site must be the topology's")
    control: RlcControl = RlcControl()
    topology: TopologySettings = Field(description="site → hall → row → rack with limits")
    leases: LeaseTiming = LeaseTiming()
    allocation: AllocationSettings = AllocationSettings()
    fleet: FleetKvSettings = FleetKvSettings()
    leadership: LeadershipSettings = Field(
        default_factory=lambda: LeadershipSettings(bucket="rackplane_leases"),
        description="2–3 replicas on the NATS cluster, only the lease holder allocates and "
        "writes budget leases (off: a single instance)")
    campaign: CampaignSettings = Field(default_factory=lambda: CampaignSettings(),
                                       description="validation campaigns (issue 17)")
    commands: CommandSettings = Field(default_factory=lambda: CommandSettings(),
                                      description="command path (the pair's handover)")

    @classmethod
    def example_values(cls) -> dict[str, Any]:
        """The required sections' examples (`rackplane.config.EXAMPLE_VALUES_HOOK`): written
        commented out by ``--print-default-config``."""
        return {"topology": example_topology()}

    @model_validator(mode="before")
    @classmethod
    def _topology_required(cls, data: Any, info: ValidationInfo) -> Any:
        if info.context and info.context.get(REQUIRED_CHECKED):
            return data  # `required_parts` said it, beside every other problem of the file
        why = _no_topology(data)
        if why is not None:
            raise ValueError(why)
        return data

    @model_validator(mode="after")
    def _site(self) -> RlcConfig:
        if self.identity.site != self.topology.site:
            raise ValueError(f"identity.site {self.identity.site!r} differs from topology.site "
                             f"{self.topology.site!r}")
        if self.fleet.request_timeout_s > self.fleet.cycle_s:
            raise ValueError("fleet.request_timeout_s must be <= fleet.cycle_s")
        if self.leases.ttl_s < 3 * self.fleet.cycle_s:
            raise ValueError(f"leases.ttl_s ({self.leases.ttl_s}) must be >= 3 × "
                             f"fleet.cycle_s ({self.fleet.cycle_s}): renewed at ttl_s / 3")
        return self


def config_warnings(cfg: RlcConfig) -> list[str]:
    """What ``--check-config`` prints and the daemon logs at start, beside the refusals: the
    pair's servers (`LeadershipSettings.warnings`); ``leases.agent_cap_ttl_s`` shorter than
    racky's cap TTL (a dead rack's caps may outlive the wait: its share re-granted while its
    trays still draw it; tests with stand-in agents shorten it on purpose); and, with
    ``[leadership]``, leases shorter than an rlc failover (lease + one renewal): every rack
    falls to its floor while the new leader takes over."""
    out = cfg.leadership.warnings()
    if cfg.leases.agent_cap_ttl_s < RACKY_CAP_TTL_S:
        out.append(f"leases.agent_cap_ttl_s ({cfg.leases.agent_cap_ttl_s:g} s) is below racky's "
                   f"cap TTL ({RACKY_CAP_TTL_S:g} s): a silent rack's trays may keep their caps "
                   "after its share is re-granted; set it to at least the agents' cap TTL")
    ls = cfg.leadership
    if ls.enabled and cfg.leases.ttl_s <= ls.lease_s + ls.renew_every_s:
        out.append(f"leases.ttl_s ({cfg.leases.ttl_s:g} s) is not above leadership.lease_s + "
                   f"leadership.renew_every_s ({ls.lease_s + ls.renew_every_s:g} s): budget "
                   "leases expire during an rlc failover and every rack falls to its floor")
    return out
