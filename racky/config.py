"""racky's configuration: one TOML file, validated at load (DESIGN §3 Config).

``racky --print-default-config`` prints every key with its default and description (the same
text as ``config/racky.example.toml``); ``racky --check-config`` validates a file. Defaults
describe one GB200 NVL72 rack (18 compute trays × 4 GPUs, REFERENCE §1.1) behind the
simulator's node agents (docs/SIMULATORS.md §5); every figure's source is in its description.

Relative paths of racky's own files (``lifecycle.state_file``, ``validation.report_dir``) are
taken inside ``$STATE_DIRECTORY`` under systemd, else the working directory (`state_path`).
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rackplane.config import StrictModel
from rackplane.config_plausibility import Plausible, plausibility_warnings
from rackplane.core.names import TOPIC_LEVEL_PATTERN, check_topic_levels
from rackplane.core.plausibility import PlausibilityWindow, merge_windows
from rackplane.leadership_settings import LeadershipSettings
from rackplane.paths import in_state_directory
from rackplane.settings import (
    CommandSettings,
    DaemonSettings,
    ModbusTargetSettings,
    TopicLevel,
    resolve_path,
)
from racky.core.campaign_gate import CampaignGateSettings
from racky.fleet_settings import FleetSettings, check_fleet, fleet_warnings
from racky.link_settings import LinkSettings, TrafficSettings

__all__ = [
    "LIFECYCLE_STATES",
    "BlastRadiusSettings",
    "CoolingSettings",
    "DerateSettings",
    "DiscoverySettings",
    "LifecycleSettings",
    "NodeAgentsSettings",
    "PowerSettings",
    "RackyConfig",
    "RackyControl",
    "SequencingSettings",
    "ShelfPoints",
    "ThermalSettings",
    "ValidationSettings",
    "config_warnings",
    "state_path",
]

LIFECYCLE_STATES = ("provisioning", "validating", "production", "maintenance", "quarantined")
LifecycleState = Literal["provisioning", "validating", "production", "maintenance", "quarantined"]

_THING_RE = re.compile(TOPIC_LEVEL_PATTERN)


class RackyControl(StrictModel):
    """Timing of racky's tick and of what it publishes."""

    tick_s: float = Field(
        1.0, ge=0.1, le=10, description="detection and power-control tick, s (1 Hz: the "
        "telemetry rate of the node agents; lock-step figures are measured at 1 Hz)"
    )
    state_interval_s: float = Field(5.0, gt=0, le=600, description="retained state/health")
    node_telemetry_interval_s: float = Field(
        5.0, gt=0, le=600, description="per-tray power and caps to the time series, s"
    )
    link_telemetry_interval_s: float = Field(
        60.0, gt=0, le=3600, description="per-port link figures to the time series, s (one "
        "line per port: 1,440 lines per NVL72 rack each time)"
    )
    stop_budget_s: float = Field(3.0, gt=0, le=30, description="time allowed at shutdown")


class ShelfPoints(StrictModel):
    """Which power-shelf register-map points mean what (``config/registers/power-shelf.toml``)."""

    output_power: str = Field("shelf_output_power_w", description="shelf DC output, W")
    input_power: str = Field("shelf_input_power_w", description="shelf AC input, W")
    available: str = Field("shelf_available_w", description="shelf live capacity, W")
    status: str = Field("shelf_status", description="shelf status bits")
    rack_capacity: str = Field("rack_capacity_w", description="rack live capacity, W")
    rack_load: str = Field("rack_load_w", description="rack DC load (IT power, BBU share "
                           "included), W")
    rack_redundant_feeds: str = Field("rack_redundant_feeds", description="1 while N+N")
    rack_spare_psus: str = Field("rack_spare_psus", description="PSU failures tolerated")
    psus_ok: str = Field("psus_ok", description="PSUs delivering")
    psu_temp: str = Field("psu{n}_temp_c", description="PSU temperature point, {n} = 1..")
    psu_status: str = Field("psu{n}_status", description="PSU status bits point, {n} = 1..")
    psus_per_shelf: int = Field(6, ge=1, le=16, description="PSUs per shelf (REF §1.2 [S])")
    psu_failed_bit: int = Field(1, ge=0, le=15, description="PSU status bit: failed")
    psu_derated_bit: int = Field(2, ge=0, le=15, description="PSU status bit: derated")
    psu_ac_lost_bit: int = Field(3, ge=0, le=15, description="PSU status bit: AC input lost")
    shelf_ac_lost_bit: int = Field(1, ge=0, le=15, description="shelf status bit: AC lost")
    shelf_overloaded_bit: int = Field(3, ge=0, le=15, description="shelf status bit: rack "
                                      "load above live capacity")
    shelf_bbu_bit: int = Field(4, ge=0, le=15, description="shelf status bit: BBU "
                               "discharging")


class DiscoverySettings(StrictModel):
    """Power-shelf discovery over a unit-id range (Meta rackmon practice, REFERENCE §8: full
    scan at start, then one address per ~2 min; failed devices re-probed every 2-3 min)."""

    enabled: bool = Field(False, description="scan for power shelves instead of (or besides) "
                          "the configured power_shelves")
    host: str = Field("127.0.0.1", min_length=1)
    port: int = Field(502, ge=1, le=65535)
    unit_id_first: int = Field(1, ge=0, le=255)
    unit_id_last: int = Field(16, ge=0, le=255)
    register_map: Path = Field(Path("power-shelf"), description="map of the shelves found")
    name_prefix: str = Field("shelf-u", description="device name = prefix + unit id")
    poll_interval_s: float = Field(1.0, gt=0, le=60)
    timeout_s: float = Field(0.5, gt=0, le=10, description="probe and poll timeout, s")
    slow_scan_interval_s: float = Field(
        120.0, gt=0, description="after the first full scan, probe one unknown address this "
        "often, s (rackmon: ~2 min)"
    )
    dormant_after_s: float = Field(
        15.0, gt=0, description="a found shelf that has not answered for this long is dormant: "
        "its owner task stops polling it"
    )
    reprobe_dormant_s: float = Field(
        150.0, gt=0, description="a dormant shelf is re-probed this often, s (rackmon: 2-3 min)"
    )

    @field_validator("register_map")
    @classmethod
    def _map(cls, v: Path, info: ValidationInfo) -> Path:
        if len(v.parts) == 1 and v.suffix == "":
            return v
        return resolve_path(v, info)

    @model_validator(mode="after")
    def _range(self) -> DiscoverySettings:
        if self.unit_id_last < self.unit_id_first:
            raise ValueError("unit_id_last must be >= unit_id_first")
        if not _THING_RE.fullmatch(self.name_prefix + "0"):
            raise ValueError("name_prefix must be topic/tag safe")
        return self


class NodeAgentsSettings(StrictModel):
    """The node agents racky caps (the simulator's, docs/SIMULATORS.md §5; on real hardware
    tray BMC / NVML agents behind the same contract)."""

    daemon: TopicLevel = Field(
        "sim", description="topic level of the agents: commands go to "
        "<root>/<site>/<rack>/<daemon>/cmd/<user>/set_power_limits, telemetry comes from "
        "<...>/<daemon>/telemetry/trayNN"
    )
    user: TopicLevel | None = Field(
        None, description="the <user> topic level of racky's commands (the broker username); "
        "default mqtt.username, else 'racky'"
    )
    trays: int = Field(18, ge=1, le=64, description="compute trays (REF §1.1: 18 [S])")
    gpus_per_tray: int = Field(4, ge=1, le=16, description="GPUs per tray (REF §1.1: 4 [S])")
    tray_thing_prefix: str = Field("tray", description="telemetry thing of tray k: prefix + "
                                   "two digits")
    gpu_tgp_w: float = Field(1200.0, gt=0, description="GPU TDP/TGP, W (REF §1.1: B200 in "
                             "GB200 1,200 W [S/S2])")
    gpu_min_power_limit_w: float = Field(
        200.0, gt=0, description="lowest per-GPU cap an agent accepts, W [U] (the simulator's)"
    )
    other_share: float = Field(
        0.486, ge=0, le=3, description="non-GPU tray power as a share of GPU power, used until "
        "measured (docs/SIMULATORS.md: (132 − 86.4 − 3.6) / 86.4 [D])"
    )
    non_tray_power_w: float = Field(
        3600.0, ge=0, description="rack power outside the compute trays (9 switch trays × "
        "0.4 kW, REF §1.1 [S2]), used until measured"
    )
    stale_after_s: float = Field(5.0, gt=0, le=120, description="tray telemetry older than "
                                 "this is stale (no power, no detection)")
    reply_timeout_s: float = Field(5.0, gt=0, le=60, description="a command without a reply "
                                   "after this long is counted lost (reconciliation resends)")

    @field_validator("daemon", "tray_thing_prefix")
    @classmethod
    def _level(cls, v: str) -> str:
        if not _THING_RE.fullmatch(v):
            raise ValueError("must be one topic level of letters, digits, '_', ':', '-'")
        return v


class DerateSettings(StrictModel):
    """Rack power derating on warm facility water (REFERENCE §4.4, §5 S9): P_max(T_fws) from
    the exchanger valvey measures (``measured``), the nominal ``table`` until it has."""

    enabled: bool = True
    table: list[tuple[float, float]] = Field(
        default_factory=lambda: [(40.0, 260_000.0), (41.0, 208_000.0), (42.0, 156_000.0),
                                 (43.0, 104_000.0), (44.0, 52_000.0), (45.0, 0.0)],
        description="P_max(T_fws): [facility water °C, rack W] pairs, linear between (REF §4.4 "
        "[D]: ≈ 52 kW less per K at 45 °C supply; 208/156/104/52 kW at 41/42/43/44 °C)",
    )
    measured: bool = Field(
        True, description="use the cooling capacity valvey measures (its state's "
        "capacity_w_per_k: P_max = capacity_w_per_k × (setpoint − facility water)) in place of "
        "the table; the table stays the cold prior until valvey has measured (issue 21)")
    margin_k: float = Field(0.1, ge=0, le=5, description="derate as if the water were this "
                            "much warmer (the valve needs some authority left)")
    release_hysteresis_k: float = Field(
        0.5, ge=0, le=5, description="a derate is released only as the water falls this far "
        "below where it was applied"
    )
    release_ramp_w_per_s: float = Field(500.0, gt=0, description="cap rise while releasing")
    stale_after_s: float = Field(30.0, gt=0, description="facility water older than this: the "
                                 "derate holds (never released on missing data)")

    @field_validator("table")
    @classmethod
    def _table(cls, v: list[tuple[float, float]]) -> list[tuple[float, float]]:
        if len(v) < 2:
            raise ValueError("needs at least two points")
        ts = [t for t, _ in v]
        if any(b <= a for a, b in itertools.pairwise(ts)):
            raise ValueError("temperatures must increase")
        if any(not (math.isfinite(p) and p >= 0) for _, p in v):
            raise ValueError("powers must be finite and >= 0")
        if any(b > a for (_, a), (_, b) in itertools.pairwise(v)):
            raise ValueError("powers must not rise with the water temperature (warmer water "
                             "carries less heat: P_max(T_fws) falls)")
        return v


class SequencingSettings(StrictModel):
    """Staggered tray power on/off within an inrush limit."""

    inrush_limit_w: float = Field(
        21_000.0, gt=0, description="power switched on (or off) per stagger window, W [U]"
    )
    tray_inrush_w: float = Field(
        7_000.0, gt=0, description="what one tray's switching counts, W (~a full tray, [U])"
    )
    stagger_s: float = Field(2.0, gt=0, le=600, description="stagger window, s [U]")


class BlastRadiusSettings(StrictModel):
    """Bound on automated actions per time window (DESIGN §3 Safety; REFERENCE §8 UFM: at most
    max(10, 0.5 % of the fleet) isolations per cycle). Safety verbs are exempt."""

    max_actions: int = Field(10, ge=1, le=10_000)
    window_s: float = Field(600.0, gt=0)


class PowerSettings(StrictModel):
    """Rack power: the cap loop, reconciliation, capacity caps, derating, sequencing."""

    budget_w: float | None = Field(
        None, gt=0, description="rack power budget, W (measured rack power, shelf DC output); "
        "None: no budget capping (capacity, derate and requested caps still apply)"
    )
    rack_capacity_w: float = Field(
        264_000.0, gt=0, le=2_000_000.0, description="the rack's feed / power-shelf nameplate "
        "capacity, W: the ceiling of budget_w and of the set_budget and cap_rack commands, at "
        "least the rack's floor and at most 2 MW (no rack feed comes near it) (REF §1.2: GB200 "
        "reference rack 8 shelves × 6 PSUs × 5.5 kW = 264 kW nameplate [S])"
    )
    budget_margin_pct: float = Field(1.0, ge=0, le=20, description="caps aim this far below "
                                     "the budget")
    classes: dict[str, int] = Field(
        default_factory=lambda: {"critical": 0, "high": 1, "normal": 2, "low": 3},
        description="priority classes: name -> rank (0 served first)",
    )
    default_class: str = "normal"
    tray_classes: dict[str, str] = Field(
        default_factory=dict, description="tray index -> class, e.g. { '0' = 'high' }"
    )
    headroom_pct: float = Field(10.0, ge=0, le=100, description="a tray is allocated its "
                                "demand plus this much before lower classes are served")
    demand_hold_s: float = Field(10.0, ge=0, le=600, description="a tray's demand is its peak "
                                 "over this long (caps do not chase every burst)")
    cap_ramp_up_w_per_s: float = Field(2000.0, gt=0, description="per-tray cap rise limit")
    cap_deadband_w: float = Field(25.0, ge=0, description="a tray cap moves only by more than "
                                  "this (no command per tick for estimate noise), unless the "
                                  "rack is over its limit")
    cap_ramp_down_w_per_s: float = Field(
        2000.0, gt=0, description="per-tray cap fall limit when not over budget"
    )
    rack_ramp_w_per_s: float | None = Field(
        None, gt=0, description="grid-side ramp limit of the rack, W/s (REF §1.3: utilities "
        "state ramp limits); sent to the agents as per-GPU ramp limits"
    )
    power_floor_pct: float = Field(0.0, ge=0, le=100, description="per-GPU power floor sent "
                                   "to the agents, % of TGP (REF §1.3 PERCENT_TMP_FLOOR)")
    ramp_down_hysteresis_s: float = Field(
        0.0, ge=0, le=3600, description="hold before a ramp-down, s (REF §1.3)"
    )
    reconcile_tolerance_w: float = Field(
        25.0, ge=0, description="reported enforced cap within this of the desired one = applied"
    )
    reconcile_confirm_s: float = Field(
        3.0, gt=0, le=120, description="a mismatch this old is re-asserted (once per period)"
    )
    drift_alarm_s: float = Field(15.0, gt=0, description="a mismatch this old raises "
                                 "cap_drift:<tray>")
    capacity_margin_pct: float = Field(
        2.0, ge=0, le=20, description="with redundancy gone and load above live capacity, cap "
        "to capacity less this (REF §5 S10)"
    )
    confirmed_low_w: float = Field(
        10_000.0, ge=0, description="rack power below this with the trays reported off = "
        "'power_confirmed_low' (valvey may then isolate the liquid, S6 c/d)"
    )
    drift_recur_count: int = Field(
        3, ge=2, le=1000, description="this many re-asserted cap drifts of one tray within "
        "drift_recur_window_s also raise cap_drift:<tray> (a cap another writer keeps "
        "changing never drifts for drift_alarm_s), naming the commanded and held caps and the "
        "likely cause"
    )
    drift_recur_window_s: float = Field(
        600.0, gt=0, le=86_400, description="window of drift_recur_count, s; the alarm clears "
        "when the window holds fewer"
    )
    derate: DerateSettings = DerateSettings()
    sequencing: SequencingSettings = SequencingSettings()
    blast_radius: BlastRadiusSettings = BlastRadiusSettings()

    @model_validator(mode="after")
    def _classes(self) -> PowerSettings:
        if self.default_class not in self.classes:
            raise ValueError(f"default_class {self.default_class!r} is not in classes")
        for tray, cls in self.tray_classes.items():
            if not tray.isdigit():
                raise ValueError(f"tray_classes key {tray!r} must be a tray index")
            if cls not in self.classes:
                raise ValueError(f"tray_classes[{tray}] = {cls!r} is not in classes")
        return self


class CoolingSettings(StrictModel):
    """Where racky learns about cooling (valvey's state on MQTT) and what 'cooling is the
    cause' means."""

    daemon: TopicLevel = Field("valvey", description="topic level of the cooling daemon")
    state_thing: TopicLevel = Field("supply_loop", description="its retained state/<thing>")
    plant_topic: str | None = Field(
        None, description="optional full topic with flow_lpm / facility_supply_temp_c when the "
        "cooling state lacks them (the simulator's <...>/sim/telemetry/plant)"
    )
    stale_after_s: float = Field(15.0, gt=0, description="cooling state older than this: "
                                 "unknown")
    supply_high_k: float = Field(1.0, gt=0, description="supply above setpoint by this = "
                                 "cooling abnormal (REF §5 S9: SP + 1 K)")
    flow_low_lpm: float | None = Field(
        None, gt=0, description="flow below this = cooling abnormal (None: not judged)"
    )
    fault_alarms: list[str] = Field(
        default_factory=lambda: [  # each names a kind of valvey/core/alarm_defs.py (a test)
            "cdu_local_control", "pump_*_fault", "pump_failover", "pump_no_standby",
            "pump_loop_failsafe", "valve_*_fault", "valve_no_spare", "flow_low",
            "flow_low_interlock", "no_flow_power_down", "supply_temp_high_interlock",
            "supply_temp_rising", "coolant_inventory_loss", "rack_isolated"], max_length=64,
        description="valvey alarm ids (fnmatch patterns) that make the cooling abnormal while "
        "valvey's state lists them active (its 'alarms'): a pump or valve fault, lost flow, "
        "a loop in failsafe or local control, an isolated rack. Every active valvey alarm is "
        "named in the overheat alarms' cooling text")

    @field_validator("plant_topic")
    @classmethod
    def _plant_topic(cls, v: str | None) -> str | None:
        # A subscribed topic: each level a topic level (rackplane.core.names).
        return None if v is None else check_topic_levels(v, "plant_topic")



class ThermalSettings(StrictModel):
    """Overheating: GPU, tray, PSU, cable (REFERENCE §1.6, §3.4)."""

    gpu_warn_margin_c: float = Field(
        2.0, description="warn when the GPU's T.Limit margin falls to this, K (T.Limit = "
        "T_maxop − Tj, REF §1.6)"
    )
    gpu_slowdown_offset_c: float = Field(
        3.0, gt=0, description="HW slowdown below −offset (REF §1.6: 3 K on B200, 2 K on "
        "GB200/GB300 [S])"
    )
    gpu_warn_for_s: float = Field(2.0, ge=0)
    gpu_hysteresis_c: float = Field(2.0, ge=0)
    rise_k_per_s: float = Field(2.0, gt=0, description="dTj/dt above this ... (REF §3.4 [D])")
    rise_for_s: float = Field(2.0, ge=0, description="... for this long at flat power")
    flat_power_pct: float = Field(5.0, gt=0, description="power within this % = 'flat'")
    rise_flat_s: float = Field(12.0, ge=0, description="the rise rule needs the power flat "
                               "this long (3 plate time constants, REF §1.7: τ ≈ 4 s)")
    predict_steady_s: float = Field(3.0, ge=0, description="the prediction needs the power "
                                    "steady this long (the slope window)")
    predict_horizon_s: float = Field(
        60.0, gt=0, description="warn when the predicted time to the slowdown threshold is "
        "below this (linear extrapolation of the rise)"
    )
    predict_min_slope_k_per_s: float = Field(0.2, gt=0, description="slopes below this "
                                             "predict nothing (sensor noise)")
    protect: bool = Field(True, description="cap a tray whose GPUs head for slowdown when "
                          "cooling is normal (the tray is the cause)")
    protect_horizon_s: float = Field(30.0, gt=0, description="protect when the predicted time "
                                     "to slowdown is below this")
    protect_target_margin_c: float = Field(
        3.0, description="a protective cap aims the hottest GPU at this T.Limit margin, K"
    )
    protect_release_w_per_s: float = Field(20.0, gt=0, description="per-GPU cap rise while "
                                           "the margin allows")
    plate_tau_s: float = Field(
        10.0, gt=0, le=600, description="cold-plate time constant, s: with learn_plate_tau "
        "the protective cap's look-ahead (2τ) until the GPU's own is learned (no steady-state "
        "prediction before it); learning off, the one τ of both. Long on purpose: a longer "
        "look-ahead caps deeper; a healthy plate is a few s (REF §1.7: ≈ 4 s [D]), a fouled "
        "one longer [U]"
    )
    learn_plate_tau: bool = Field(
        True, description="learn each GPU's plate time constant from its junction's response "
        "to a power step (racky.core.plate_tau); false: plate_tau_s always"
    )
    plate_tau_min_s: float = Field(
        1.0, gt=0, le=600, description="plausibility window of a learned plate time "
        "constant, s: a fit outside [min, max] is not learned"
    )
    plate_tau_max_s: float = Field(60.0, gt=0, le=600, description="see plate_tau_min_s")
    tray_outlet_limit_c: float = Field(65.0, description="tray coolant outlet alarm, °C [U]")
    psu_warn_c: float = Field(80.0, description="PSU temperature warning, °C [U]")
    psu_limit_c: float = Field(85.0, description="PSU over-temperature, °C (the simulator's "
                               "flag [U])")
    hysteresis_c: float = Field(2.0, ge=0, description="tray/PSU/cable clear hysteresis")
    for_s: float = Field(5.0, ge=0, description="tray/PSU/cable on-delay")
    many_trays: int = Field(3, ge=1, description="this many trays hot with cooling normal = "
                            "rack-wide cause (load or loop), not one tray")


class LifecycleSettings(StrictModel):
    """The rack lifecycle and where it is persisted."""

    state_file: Path | None = Field(
        None, description="versioned state file (lifecycle, trays powered off by safety "
        "requests, last validation); None: racky-state-<site>-<row>-<rack>.json, one per rack "
        "(two racky daemons started from one folder never share it); relative: in "
        "$STATE_DIRECTORY or the working directory"
    )
    initial_state: LifecycleState = Field("provisioning", description="state of a new rack")
    quarantine_on_alarms: list[str] = Field(
        default_factory=list, description="alarm kinds (e.g. link_flapping, port_dropped) "
        "whose raise quarantines a rack in production or maintenance, forgetting its passed "
        "validation: it returns to production only through a new one; []: no alarm moves "
        "the lifecycle")

    @field_validator("quarantine_on_alarms")
    @classmethod
    def _known_alarm_kinds(cls, v: list[str]) -> list[str]:
        if not v:  # the class default, validated while this module is still loading
            return v
        from racky.core.controller import ALARM_KINDS  # the core imports this module

        unknown = sorted(set(v) - {k.kind for k in ALARM_KINDS})
        if unknown:
            raise ValueError(f"unknown alarm kind(s) {', '.join(unknown)}; racky's kinds: "
                             f"{', '.join(sorted(k.kind for k in ALARM_KINDS))}")
        return v


class ValidationSettings(StrictModel):
    """Staged validation (node, rack, multi-rack) pass/fail criteria and reports."""

    report_dir: Path = Field(Path("validation"), description="Markdown + PNG reports; "
                             "relative: in $STATE_DIRECTORY or the working directory")
    load_s: float = Field(600.0, gt=0, description="burn-in under load, s")
    backend_s: float = Field(300.0, ge=0, description="NVLink disabled, backend traffic, s")
    min_t_limit_margin_c: float = Field(3.0, description="T.Limit margin under load >= this")
    allow_throttle: bool = Field(False, description="any HW slowdown fails")
    max_pre_fec_per_min: float = Field(2.0, gt=0, description="pre-FEC mean rate per port "
                                       "<= this (IBTA 120/h)")
    max_power_over_budget_pct: float = Field(2.0, ge=0)
    power_settle_s: float = Field(
        5.0, ge=0, le=60, description="the power criterion judges each sample against the "
        "highest limit in force over this long before it, s: a lowered limit (a lease moved, "
        "a cap request) shows in the rack's power only after racky's next tick, the agents' "
        "command and read-back and the GPUs' apply delay (0: the limit of the sample itself)")
    min_backend_fraction: float = Field(0.3, gt=0, le=1, description="NIC throughput in the "
                                        "backend phase >= this share of line rate")
    max_nvlink_fraction_backend: float = Field(0.01, ge=0, le=1, description="NVLink "
                                               "throughput in the backend phase <= this")


def _default_commands() -> CommandSettings:
    return CommandSettings(users={"valvey": "automation", "rlc": "operator"})


def default_plausibility() -> dict[str, PlausibilityWindow]:
    """Plausibility windows of racky's cooling inputs (they feed the derate and the thermal
    limits): coolant and facility water in °C, flow in L/min [U: physics of a warm-water TCS,
    REFERENCE §1.4, §4.3 (design flow 198 L/min)]; a kelvin or °F reading, or m³/h where L/min
    is expected, is outside."""
    w = PlausibilityWindow
    temp = {"min": -10.0, "max": 100.0, "source": "TCS / facility water, °C [U]"}
    return {
        "supply_temp_c": w(**temp),
        "setpoint_c": w(**temp),
        "facility_supply_temp_c": w(**temp),
        "flow_lpm": w(min=0.0, max=2000.0, source="secondary flow, L/min: ~10 × design [U]"),
        "capacity_w_per_k": w(min=1000.0, max=1_000_000.0, source="valvey's measured cooling "
                              "capacity, rack W per K of approach: ~52 kW/K nominal (REFERENCE "
                              "§4.4); kW/K where W/K is expected falls outside [U]"),
        # the node agents' figures racky's caps and thermal limits use (a tray message with
        # one outside is refused whole, as any bad tray message)
        "tray_power_w": w(min=0.0, max=20_000.0, source="one compute tray, W: GB300 tray "
                          "~6.6 kW (REFERENCE §1) x 3; kW or mW units fall outside"),
        "tray_coolant_out_temp_c": w(**temp),
        "gpu_power_w": w(min=0.0, max=3000.0, source="one GPU, W: B300 1.4 kW TDP (REFERENCE §1) "
                         "x 2"),
        "gpu_temp_c": w(min=-10.0, max=150.0, source="GPU junction, °C: shutdown ~ 90-105 "
                        "[U]; kelvin or °F fall outside"),
    }


class RackyConfig(DaemonSettings):
    """The whole racky config file."""

    power_shelves: list[ModbusTargetSettings] = Field(
        default_factory=list, description="power shelves polled over Modbus TCP (register map "
        "power-shelf); discovered shelves come on top"
    )
    shelf_points: ShelfPoints = ShelfPoints()
    discovery: DiscoverySettings = DiscoverySettings()
    control: RackyControl = RackyControl()
    node_agents: NodeAgentsSettings = NodeAgentsSettings()
    power: PowerSettings = PowerSettings()
    cooling: CoolingSettings = CoolingSettings()
    links: LinkSettings = LinkSettings()
    thermal: ThermalSettings = ThermalSettings()
    traffic: TrafficSettings = TrafficSettings()
    lifecycle: LifecycleSettings = LifecycleSettings()
    validation: ValidationSettings = ValidationSettings()
    leadership: LeadershipSettings = Field(
        default_factory=lambda: LeadershipSettings(),
        description="redundant pair (issue 15, docs/OPERATIONS.md §6): two instances on a "
        "NATS JetStream cluster; only the lease holder sends commands to the node agents "
        "(epoch 2**62 + its lease epoch) and writes the shelves; off by default")
    fleet: FleetSettings = Field(
        default_factory=lambda: FleetSettings(),
        description="one rack of an rlc fleet (issue 16): the budget is also bounded by rlc's "
        "lease in the fleet KV bucket, the floor without one; off by default")
    campaign_gate: CampaignGateSettings = Field(
        default_factory=lambda: CampaignGateSettings(),
        description="fleet mode only (issue 17): production only on rlc's order with a "
        "campaign's passes judged here (racky/core/campaign_gate.py)")
    commands: CommandSettings = Field(
        default_factory=_default_commands,
        description="command path: roles of broker users (valvey = automation, CONTRACTS.md; "
        "rlc = operator: its campaigns start validations and order production)",
    )
    plausibility: dict[str, PlausibilityWindow] = Field(
        default_factory=default_plausibility,
        description="plausibility window (min, max) per input, laid over the defaults: the "
        "cooling inputs (valvey's state and the plant topic: supply_temp_c, setpoint_c, "
        "flow_lpm, facility_supply_temp_c; one outside makes the cooling reading unknown, the "
        "derate holds) and the node agents' tray_power_w, tray_coolant_out_temp_c, "
        "gpu_power_w, gpu_temp_c (a tray message with one outside is refused, the tray's "
        "reading ages); alarm input_implausible names the input. The shelves' points have "
        "theirs in the register map (valid_min / valid_max)",
    )

    @field_validator("plausibility", mode="before")
    @classmethod
    def _windows(cls, v: object) -> object:
        return merge_windows(default_plausibility(), v)

    @model_validator(mode="after")
    def _cross(self) -> RackyConfig:
        names = [s.name for s in self.power_shelves]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"power_shelves: duplicate names {dup}")
        for tray in self.power.tray_classes:
            if int(tray) >= self.node_agents.trays:
                raise ValueError(f"power.tray_classes: tray {tray} >= node_agents.trays")
        b = self.power.budget_w
        lo, hi = self.rack_floor_w, self.power.rack_capacity_w
        if hi < lo:
            raise ValueError(
                f"power.rack_capacity_w = {hi:g} W is below the rack's floor {lo:g} W "
                "(node_agents.trays × the lowest tray cap + non_tray_power_w): no budget could "
                "be met with every tray on; capacities are in W, not kW")
        if b is not None and not lo <= b <= hi:
            raise ValueError(
                f"power.budget_w = {b:g} W is outside [{lo:g}, {hi:g}] W (the rack's floor: "
                "node_agents.trays × the lowest tray cap + non_tray_power_w .. "
                "power.rack_capacity_w); budgets are in W, not kW")
        # a shelf value is good until the shelves' stale limit after its last good read: a
        # slower poll would make it stale between two good reads (issue 14)
        limit = self.shelf_stale_after_s
        polls = [(f"power_shelves[{i}].poll_interval_s", s.poll_interval_s)
                 for i, s in enumerate(self.power_shelves)]
        if self.discovery.enabled:
            polls.append(("discovery.poll_interval_s", self.discovery.poll_interval_s))
        for key, poll in polls:
            if poll >= limit:
                raise ValueError(f"{key} ({poll:g} s) must be shorter than the shelves' stale "
                                 f"limit max(node_agents.stale_after_s, 3 s) = {limit:g} s")
        self._check_pair()
        check_fleet(self)
        return self

    def _check_pair(self) -> None:
        """A pair's fence of last resort at the trays (issue 15): the agents' cap TTL
        (`racky.core.agent_settings.CAP_TTL_S`: caps lapse when no command refreshed them).
        A failover must not let racky's caps lapse: the old active's last refresh may be
        `CAP_REFRESH_S` old when it dies, the standby takes over within the lease and one
        renewal period, and sends on its next tick. racky has no other device watchdog (it
        only reads the shelves)."""
        ls = self.leadership
        if not ls.enabled:
            return
        from racky.core.agent_settings import CAP_REFRESH_S, CAP_TTL_S  # (imports this module)

        need = CAP_REFRESH_S + ls.lease_s + ls.renew_every_s + self.control.tick_s
        if not need < CAP_TTL_S:
            raise ValueError(
                f"leadership.lease_s ({ls.lease_s:g} s) too long for the agents' cap TTL: the "
                f"cap refresh period ({CAP_REFRESH_S:g} s) + lease_s + leadership.renew_every_s "
                f"({ls.renew_every_s:g}) + control.tick_s ({self.control.tick_s:g}) = {need:g} s "
                f"must be below the caps' ttl_s ({CAP_TTL_S:g} s), or a failover lets the "
                "trays' caps lapse")

    @property
    def rack_floor_w(self) -> float:
        """The rack's floor, W: every tray at the lowest cap its agent accepts (GPUs × the
        GPUs' minimum power limit × (1 + the non-GPU share), rounded up as
        `racky.core.power.CapAllocator.tray_min_w`) plus the power outside the trays. No
        budget below it can be met with every tray on."""
        a = self.node_agents
        tray_min = math.ceil(a.gpus_per_tray * a.gpu_min_power_limit_w * (1.0 + a.other_share)
                             + 1.0)
        return float(a.trays * tray_min + a.non_tray_power_w)

    @property
    def shelf_stale_after_s(self) -> float:
        """How long a shelf's last good value holds, s (`racky.core.controller`: the shelves
        are read with the node agents' stale limit, at least 3 s)."""
        return max(self.node_agents.stale_after_s, 3.0)

    @property
    def command_user(self) -> str:
        """The <user> level racky sends node-agent commands under."""
        return self.node_agents.user or self.mqtt.username or "racky"


PLAUSIBLE: tuple[Plausible, ...] = (
    Plausible("power.budget_w", 10_000.0, 600_000.0, "W", "REFERENCE §1.1: GB200 NVL72 "
              "≈120-132 kW, GB300 ≈142 kW, Vera Rubin 130-230 kW, Kyber up to 600 kW [S2]",
              "kW written as W?"),
    Plausible("power.rack_capacity_w", 10_000.0, 1_000_000.0, "W", "REFERENCE §1.2: 8 "
              "shelves × 33 kW = 264 kW nameplate [S]; 400 kW racks with 160 kW shelves [S2]",
              "kW written as W?"),
    Plausible("power.confirmed_low_w", 100.0, 50_000.0, "W", "a rack with its trays off "
              "draws its switch trays and fans: ≈3.6 kW for NVL72 (REFERENCE §1.1)"),
    Plausible("node_agents.gpu_tgp_w", 100.0, 3_000.0, "W", "REFERENCE §1.1: B200 1.2 kW, "
              "GB300 1.4 kW, Rubin ≈1.8-2.3 kW per GPU", "kW written as W?"),
    Plausible("node_agents.gpu_min_power_limit_w", 50.0, 1_000.0, "W", "NVML minimum power "
              "limits are a few hundred W (REFERENCE §1.3)"),
    Plausible("node_agents.non_tray_power_w", 0.0, 50_000.0, "W", "REFERENCE §1.1: 9 switch "
              "trays × 0.4 kW = 3.6 kW [S2]"),
    Plausible("cooling.flow_low_lpm", 10.0, 3_000.0, "L/min", "REFERENCE §1.4: 1.5 L/min per "
              "kW, 198 L/min for a 132 kW rack [S2]", "m³/h or L/s written as L/min?"),
    Plausible("thermal.tray_outlet_limit_c", 30.0, 90.0, "°C", "REFERENCE §1.4: DLC supply "
              "25-45 °C, return ≈10 K above", "°F written as °C?"),
    Plausible("thermal.psu_warn_c", 40.0, 120.0, "°C", "PSU electronics derate and trip near "
              "80-100 °C [U]; racky's defaults 80 / 85 °C", "°F written as °C?"),
    Plausible("thermal.psu_limit_c", 40.0, 120.0, "°C", "PSU electronics derate and trip near "
              "80-100 °C [U]; racky's defaults 80 / 85 °C", "°F written as °C?"),
    Plausible("links.cable_temp_limit_c", 40.0, 110.0, "°C", "REFERENCE §8: cable and "
              "transceiver alarm at 70 °C (UFM)", "°F written as °C?"),
    Plausible("power.sequencing.inrush_limit_w", 1_000.0, 1_000_000.0, "W", "REFERENCE §1.2: "
              "33 kW shelves; a tray's inrush is kW [U]", "kW written as W?"),
    Plausible("power.sequencing.tray_inrush_w", 100.0, 50_000.0, "W", "REFERENCE §1.1: a "
              "compute tray of 4 GPUs draws several kW", "kW written as W?"),
)
"""Physical ranges of racky's config values (`config_warnings`; issue 14 item 18)."""


def config_warnings(cfg: RackyConfig) -> list[str]:
    """Warnings for values far outside their physical range (`PLAUSIBLE`) and a budget above
    what the rack can draw (it never binds), a pair's loopback-only NATS servers
    (`LeadershipSettings.warnings`), a fleet user other than this rack's
    (`racky.fleet_settings.fleet_warnings`): printed by ``--check-config``, logged at start."""
    out = plausibility_warnings(cfg, PLAUSIBLE)
    a, b = cfg.node_agents, cfg.power.budget_w
    most = a.trays * a.gpus_per_tray * a.gpu_tgp_w * (1.0 + a.other_share) + a.non_tray_power_w
    if b is not None and b > 1.5 * most:
        out.append(f"power.budget_w = {b:g} W is more than 1.5 × what the rack can draw "
                   f"({most:.0f} W: node_agents trays × GPUs × gpu_tgp_w × (1 + other_share) + "
                   "non_tray_power_w): the budget never binds")
    return out + cfg.leadership.warnings() + fleet_warnings(cfg)


def state_path(p: Path, environ: dict[str, str] | None = None) -> Path:
    """A racky file path: absolute as given; relative inside ``$STATE_DIRECTORY`` (first entry)
    under systemd, else the working directory."""
    return in_state_directory(p, environ)

