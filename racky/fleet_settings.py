"""``[fleet]``: racky under rlc's budget leases (issue 16 item 2; pure pydantic, no I/O).

Off by default: a single rack's racky works exactly as before (its budget is the config's or
``set_budget``'s). With ``enabled = true`` the budget in force is also bounded by the lease
rlc grants in the fleet KV bucket (`racky.fleet`), or by ``floor_w`` when no lease is in force.

Checked at load (`check_fleet`, called by `racky.config.RackyConfig`; messages name the keys):

- Σ of the agents' safe caps ≤ ``floor_w``: every tray at ``agent_safe_gpu_cap_w`` per GPU
  (× (1 + ``node_agents.other_share``)) plus ``node_agents.non_tray_power_w``. When racky
  dies, its agents fall to their safe caps after their cap TTL; rlc counts on the rack then
  drawing at most its floor;
- ``agent_safe_gpu_cap_w`` ≥ ``node_agents.gpu_min_power_limit_w``: an agent raises a safe cap
  below its device's lowest limit to that limit, so a lower assumption undercounts;
- ``floor_w`` ≥ the rack's own floor (`racky.config.RackyConfig.rack_floor_w`: every tray at
  the lowest cap its agent accepts): racky must be able to meet its floor with every tray on;
- ``floor_w`` / ``input_ratio_fallback`` (the floor as shelf DC output, the unit of
  ``power.rack_capacity_w``) ≤ ``power.rack_capacity_w``: a floor the rack's feed cannot carry
  is a typo (kW for W, another rack's figure), and rlc would hold that much of its row for it.

**One source of truth** (docs/RLC.md "Defaults and cross-checks"): the defaults come from
shared constants (``floor_w``: `rackplane.core.budget_leases.DEFAULT_RACK_FLOOR_W`, rlc's
example topology's too; ``agent_safe_gpu_cap_w``:
`rackplane.core.tray_contract.AGENT_SAFE_GPU_CAP_W`, tray-agent's ``safe_gpu_cap_w`` too).
What lives in another daemon's file is checked where both meet at run time: the agents state
their safe caps in their telemetry (`racky.fleet`), racky states its floor and their Σ in its
report, rlc compares both with its topology (`rlc.core.cycle.FleetState.mismatches`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from rackplane.core.budget_leases import DEFAULT_RACK_FLOOR_W
from rackplane.core.tray_contract import AGENT_SAFE_GPU_CAP_W
from rackplane.leadership_settings import NatsKvSettings

if TYPE_CHECKING:
    from racky.config import RackyConfig

__all__ = ["BEYOND_GRANT", "FleetSettings", "check_fleet", "fleet_warnings"]

BEYOND_GRANT = "beyond_grant"
"""Refusal code of ``set_budget`` above the rack's fleet grant (operators change budgets
through rlc)."""


class FleetSettings(NatsKvSettings):
    """racky as one rack of an rlc fleet (module docstring)."""

    username: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="NATS user of this rack's fleet connection: racky-<site>-<rack> (config/"
        "nats/fleet-permissions.conf, generated per rack of rlc's topology: only this rack's "
        "keys); unset: connect without a user (a cluster without authorization)")

    enabled: bool = Field(False, description="follow rlc's budget lease from the fleet KV "
                          "bucket (false: single rack, budget from config / set_budget)")
    bucket: str = Field("rackplane_fleet", pattern=r"^[A-Za-z0-9_-]{1,64}$",
                        description="the fleet KV bucket (rlc's [fleet] bucket)")
    floor_w: float = Field(DEFAULT_RACK_FLOOR_W, gt=0, le=1e7, allow_inf_nan=False,
                           description="safe floor, W: the budget without a lease in force "
                           "(rlc's topology floor_w of this rack)")
    agent_safe_gpu_cap_w: float = Field(
        AGENT_SAFE_GPU_CAP_W, gt=0, le=5000, allow_inf_nan=False,
        description="the per-GPU safe cap the tray agents hold when racky is silent, W "
        "(tray-agent [caps] safe_gpu_cap_w, the same default); Σ of them must fit the floor; "
        "the agents state theirs in their telemetry and racky warns of one above this")
    clock_margin_s: float = Field(2.0, ge=0, le=120, allow_inf_nan=False,
                                  description="largest wall-clock offset to rlc's host, s "
                                  "(rlc's leases.clock_margin_s)")
    read_every_s: float = Field(1.0, gt=0, le=60, allow_inf_nan=False,
                                description="the lease key is read this often (and pushed "
                                "as written, and read on every reconnect)")
    report_every_s: float = Field(1.0, gt=0, le=60, allow_inf_nan=False,
                                  description="the rack report is written on change and at "
                                  "least this often (rlc marks a silent rack unreachable)")
    input_ratio_fallback: float = Field(
        1.10, ge=1.0, le=1.25, allow_inf_nan=False,
        description="shelves' AC input / DC output assumed until measured (leases bound the "
        "AC input; racky caps the DC output): 1.10 = 91 % PSU efficiency, the safe side")
    ack_tolerance_w: float = Field(0.0, ge=0, le=10_000, allow_inf_nan=False,
                                   description="enforced caps within the lease + this count "
                                   "as within it, W")


def agents_safe_total_w(cfg: RackyConfig) -> float:
    """Σ of the agents' safe caps with the power outside the trays, W."""
    a = cfg.node_agents
    return (a.trays * a.gpus_per_tray * cfg.fleet.agent_safe_gpu_cap_w * (1.0 + a.other_share)
            + a.non_tray_power_w)


def check_fleet(cfg: RackyConfig) -> None:
    """Raise ValueError (naming the keys) when the fleet floor is inconsistent."""
    f = cfg.fleet
    if not f.enabled:
        return
    safe = agents_safe_total_w(cfg)
    if safe > f.floor_w:
        raise ValueError(
            f"fleet.floor_w = {f.floor_w:g} W is below Σ of the agents' safe caps {safe:g} W "
            "(node_agents.trays × gpus_per_tray × fleet.agent_safe_gpu_cap_w × (1 + "
            "other_share) + non_tray_power_w): a rack whose racky died could exceed its floor")
    lo = cfg.node_agents.gpu_min_power_limit_w
    if f.agent_safe_gpu_cap_w < lo:
        raise ValueError(
            f"fleet.agent_safe_gpu_cap_w = {f.agent_safe_gpu_cap_w:g} W is below "
            f"node_agents.gpu_min_power_limit_w {lo:g} W: the agents raise a safe cap to their "
            "GPUs' lowest limit, so the rack would draw more than assumed")
    if f.floor_w < cfg.rack_floor_w:
        raise ValueError(
            f"fleet.floor_w = {f.floor_w:g} W is below the rack's own floor "
            f"{cfg.rack_floor_w:g} W (every tray at its lowest cap): racky could not meet it")
    floor_dc_w = f.floor_w / f.input_ratio_fallback
    if floor_dc_w > cfg.power.rack_capacity_w:
        raise ValueError(
            f"fleet.floor_w = {f.floor_w:g} W (AC input; {floor_dc_w:.0f} W of shelf DC output at "
            f"fleet.input_ratio_fallback {f.input_ratio_fallback:g}) is above "
            f"power.rack_capacity_w {cfg.power.rack_capacity_w:g} W: the rack could never draw "
            "its floor (floors are in W, not kW)")


def fleet_warnings(cfg: RackyConfig) -> list[str]:
    """``[fleet] username`` other than the user config/nats/ generates for this rack
    (`rackplane.natsacl.fleet_rack_user`): that cluster would refuse the login or this rack's
    keys. Empty when off or without a user."""
    from rackplane.natsacl import AclError, fleet_rack_user

    f, ident = cfg.fleet, cfg.identity
    if not f.enabled or f.username is None:
        return []
    try:
        want = fleet_rack_user(ident.site, ident.rack)
    except AclError:
        want = None
    if f.username == want:
        return []
    return [f"fleet.username {f.username!r} is not this rack's fleet user "
            f"{want or 'racky-<site>-<rack>'!r} (config/nats/fleet-permissions.conf grants each "
            "rack's user only its own keys: python -m rackplane.natsacl)"]
