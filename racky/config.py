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
from rackplane.paths import in_state_directory
from rackplane.settings import (
    CommandSettings,
    DaemonSettings,
    ModbusTargetSettings,
    resolve_path,
)

__all__ = [
    "LIFECYCLE_STATES",
    "MAX_RATE_64BIT_PER_S",
    "BlastRadiusSettings",
    "CoolingSettings",
    "DerateSettings",
    "DiscoverySettings",
    "LifecycleSettings",
    "LinkSettings",
    "NodeAgentsSettings",
    "PowerSettings",
    "RackyConfig",
    "RackyControl",
    "SequencingSettings",
    "ShelfPoints",
    "ThermalSettings",
    "TrafficSettings",
    "ValidationSettings",
    "state_path",
]

LIFECYCLE_STATES = ("provisioning", "validating", "production", "maintenance", "quarantined")
LifecycleState = Literal["provisioning", "validating", "production", "maintenance", "quarantined"]

_THING_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


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
        if not _THING_RE.match(self.name_prefix + "0"):
            raise ValueError("name_prefix must be topic/tag safe")
        return self


class NodeAgentsSettings(StrictModel):
    """The node agents racky caps (the simulator's, docs/SIMULATORS.md §5; on real hardware
    tray BMC / NVML agents behind the same contract)."""

    daemon: str = Field(
        "sim", description="topic level of the agents: commands go to "
        "<root>/<site>/<rack>/<daemon>/cmd/<user>/set_power_limits, telemetry comes from "
        "<...>/<daemon>/telemetry/trayNN"
    )
    user: str | None = Field(
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
        if not _THING_RE.match(v):
            raise ValueError("must be one topic level of letters, digits, '_', '.', ':', '-'")
        return v


class DerateSettings(StrictModel):
    """Rack power derating on warm facility water (REFERENCE §4.4, §5 S9)."""

    enabled: bool = True
    table: list[tuple[float, float]] = Field(
        default_factory=lambda: [(40.0, 260_000.0), (41.0, 208_000.0), (42.0, 156_000.0),
                                 (43.0, 104_000.0), (44.0, 52_000.0), (45.0, 0.0)],
        description="P_max(T_fws): [facility water °C, rack W] pairs, linear between (REF §4.4 "
        "[D]: ≈ 52 kW less per K at 45 °C supply; 208/156/104/52 kW at 41/42/43/44 °C)",
    )
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
                                 "cap_drift.<tray>")
    capacity_margin_pct: float = Field(
        2.0, ge=0, le=20, description="with redundancy gone and load above live capacity, cap "
        "to capacity less this (REF §5 S10)"
    )
    confirmed_low_w: float = Field(
        10_000.0, ge=0, description="rack power below this with the trays reported off = "
        "'power_confirmed_low' (valvey may then isolate the liquid, S6 c/d)"
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

    daemon: str = Field("valvey", description="topic level of the cooling daemon")
    state_thing: str = Field("supply_loop", description="its retained state/<thing>")
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


MAX_RATE_64BIT_PER_S = 1e12
"""Plausible-rate bound of a 64-bit counter with no ``counter_max_rate_per_s`` entry, per s:
above any byte or error rate of an 800 Gb/s port (1e11 B/s), and 2^64 counts would take 200
days at it, so a decrease of a 64-bit counter is a reset (counter cleared), never a wrap of
2^64 − n counts (that would be a DCGM "any rise" failure and a CUSUM alarm from one bin)."""

_COUNTER_RE = re.compile(r"^(8|16|32|64)/(wrap|saturate)$")


def _default_counters() -> dict[str, str]:
    return {
        "nvl_crc_flit_errors": "64/wrap",
        "nvl_crc_data_errors": "64/wrap",
        "nvl_replay_errors": "64/wrap",
        "nvl_recovery_errors": "64/wrap",
        "symbol_error": "16/saturate",
        "link_error_recovery": "8/saturate",
        "link_downed": "8/saturate",
        "port_rcv_errors": "16/saturate",
        "carrier_changes": "32/wrap",
        "rx_bytes": "64/wrap",
        "tx_bytes": "64/wrap",
    }


class LinkSettings(StrictModel):
    """Link health: counters, flapping, error rates, BER (REFERENCE §3.1-§3.3, §8)."""

    enabled: bool = True
    counters: dict[str, str] = Field(
        default_factory=_default_counters,
        description="counter name -> '<bits>/wrap' or '<bits>/saturate' (IBA PortCounters "
        "saturate at 8/16 bits; Linux carrier_changes is 32-bit; NVLink counters 64-bit; "
        "sims.fabric's table has the sources)",
    )
    counter_max_rate_per_s: dict[str, float] = Field(
        default_factory=lambda: {"carrier_changes": 1000.0, "link_downed": 100.0},
        description="largest plausible rate per counter: a decrease whose wrapped delta "
        "exceeds rate × elapsed is a reset, not a wrap (FIELD-CASES BR-11)",
    )
    flap_events: Literal["link_downs", "transitions"] = Field(
        "link_downs", description="what the flap rules count: link-downs (NVSentinel) or every "
        "UP/DOWN transition (FIELD-CASES BR-13)"
    )
    flap_count: int = Field(3, ge=1, le=64, description="events within flap_window_s that "
                            "declare flapping (NVSentinel: 3 link-downs in 10 min [S])")
    flap_window_s: float = Field(600.0, gt=0)
    flap_quiet_s: float = Field(600.0, ge=0, description="quiet time to clear, s")
    flap_score: bool = Field(True, description="also run the decaying flap score")
    flap_score_penalty: float = Field(1.0, gt=0)
    flap_score_half_life_s: float = Field(1800.0, gt=0)
    flap_score_raise_at: float = Field(4.0, gt=0)
    flap_score_clear_below: float = Field(1.0, ge=0)
    flap_score_hold_down_s: float = Field(900.0, ge=0)
    port_drop_s: float = Field(240.0, gt=0, description="DOWN this long = 'port dropped' "
                               "(NVSentinel: 4 min [S])")
    zero_rate_counters: list[str] = Field(
        default_factory=lambda: ["nvl_replay_errors", "nvl_recovery_errors",
                                 "nvl_crc_data_errors", "link_error_recovery",
                                 "port_rcv_errors"],
        description="counters whose healthy rate is zero: any unexplained rise within "
        "zero_rate_window_s fails (DCGM, REF §8 [S]); an NVLink recovery right after a link "
        "came up is the retrain and belongs to the link incident",
    )
    zero_rate_window_s: float = Field(60.0, gt=0)
    pre_fec_nvlink: str = Field("nvl_crc_flit_errors", description="pre-FEC counter, NVLink")
    pre_fec_nic: str = Field("symbol_error", description="pre-FEC counter, NIC")
    healthy_rate_per_min: float = Field(0.5, gt=0, description="in-control pre-FEC rate λ0 "
                                        "(REF §3.3 [D])")
    cusum_lambda1_per_min: float = Field(
        1.5, gt=0, description="CUSUM design rate λ1 (k = (λ1−λ0)/ln(λ1/λ0) = 0.91/min); "
        "docs/RACKY.md §S8 for the choice"
    )
    cusum_h: float = Field(17.0, gt=0, description="CUSUM decision interval: ARL0 ≈ 1,900 "
                           "years per link (≈ 0.15 false alarms per 100,000 link-days)")
    cusum_watch_h: float | None = Field(
        8.0, gt=0, description="'watch' flag threshold (state only, no alarm): the early stage "
        "of the two-stage watch → confirm design"
    )
    bin_s: float = Field(60.0, gt=0, description="count bin of the sequential test, s (REF "
                         "§3.3: 1-minute bins)")
    fast_rate_per_s: float = Field(
        10.0, gt=0, description="pre-FEC rate above this for fast_rate_for_s fails at once "
        "(NVSentinel symbol_error > 10/s [S])"
    )
    fast_rate_for_s: float = Field(5.0, ge=0)
    ber_threshold: float = Field(1e-12, gt=0, description="pre-FEC BER limit (IBTA 1e-12, "
                                 "REF §3.2 [S])")
    ber_window_s: float = Field(300.0, gt=0, description="BER is errors / bits over this window")
    ber_for_s: float = Field(60.0, ge=0)
    uptime_tolerance_s: float = Field(5.0, ge=0, description="uptime may trail elapsed time "
                                      "by this before it means a reboot")
    cable_temp_limit_c: float = Field(70.0, description="cable/transceiver temperature alarm "
                                      "(UFM, REF §8 [S]); used when telemetry carries it")

    @field_validator("counters")
    @classmethod
    def _counter_specs(cls, v: dict[str, str]) -> dict[str, str]:
        for name, spec in v.items():
            if not _COUNTER_RE.match(spec):
                raise ValueError(f"{name}: {spec!r} must be '<8|16|32|64>/<wrap|saturate>'")
        return v

    def counter_spec(self, name: str) -> tuple[int, bool, float]:
        """(bits, saturating, max plausible rate per s) of a configured counter."""
        bits, kind = self.counters[name].split("/")
        default = MAX_RATE_64BIT_PER_S if bits == "64" else float("inf")
        return int(bits), kind == "saturate", self.counter_max_rate_per_s.get(name, default)

    @model_validator(mode="after")
    def _counters(self) -> LinkSettings:
        needed = [*self.zero_rate_counters, self.pre_fec_nvlink, self.pre_fec_nic,
                  "link_downed", "carrier_changes"]
        missing = sorted({c for c in needed if c not in self.counters})
        if missing:
            raise ValueError(f"counters {missing} are used but not defined in links.counters")
        unknown = sorted(set(self.counter_max_rate_per_s) - set(self.counters))
        if unknown:
            raise ValueError(f"counter_max_rate_per_s: {unknown} are not in links.counters")
        bad = sorted(k for k, r in self.counter_max_rate_per_s.items() if not r > 0)
        if bad:  # a NaN or a rate <= 0 would stop the link detectors at their first tick
            raise ValueError(f"counter_max_rate_per_s: {bad} must be > 0 (inf: no bound)")
        if self.cusum_lambda1_per_min <= self.healthy_rate_per_min:
            raise ValueError("cusum_lambda1_per_min must be above healthy_rate_per_min")
        if self.cusum_watch_h is not None and self.cusum_watch_h >= self.cusum_h:
            raise ValueError("cusum_watch_h must be below cusum_h")
        if self.flap_score_clear_below >= self.flap_score_raise_at:
            raise ValueError("flap_score_clear_below must be below flap_score_raise_at")
        return self


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
    plate_tau_s: float = Field(4.0, gt=0, description="cold-plate time constant for the "
                               "steady-state estimate (REF §1.7: ≈ 4 s [D])")
    tray_outlet_limit_c: float = Field(65.0, description="tray coolant outlet alarm, °C [U]")
    psu_warn_c: float = Field(80.0, description="PSU temperature warning, °C [U]")
    psu_limit_c: float = Field(85.0, description="PSU over-temperature, °C (the simulator's "
                               "flag [U])")
    hysteresis_c: float = Field(2.0, ge=0, description="tray/PSU/cable clear hysteresis")
    for_s: float = Field(5.0, ge=0, description="tray/PSU/cable on-delay")
    many_trays: int = Field(3, ge=1, description="this many trays hot with cooling normal = "
                            "rack-wide cause (load or loop), not one tray")


class TrafficSettings(StrictModel):
    """Irregular traffic: per-port throughput vs what the workload implies."""

    enabled: bool = True
    nvlink_share: float = Field(1.0, gt=0, le=1, description="NVLink throughput per unit of "
                                "GPU traffic, fraction of line rate [U]")
    nic_share: float = Field(0.5, gt=0, le=1, description="NIC throughput per unit of GPU "
                             "traffic, fraction of line rate [U]")
    min_expected_fraction: float = Field(0.05, gt=0, le=1, description="below this expected "
                                         "share of line rate nothing is judged")
    silent_fraction: float = Field(0.1, gt=0, lt=1, description="below this share of the "
                                   "expected throughput a port is silent")
    silent_for_s: float = Field(30.0, ge=0)
    stall_for_s: float = Field(10.0, ge=0)
    burst_excess: float = Field(0.5, gt=0, description="above expected × (1 + this) + 5 % of "
                                "line = a burst")
    burst_for_s: float = Field(10.0, ge=0)


class LifecycleSettings(StrictModel):
    """The rack lifecycle and where it is persisted."""

    state_file: Path = Field(
        Path("racky-state.json"), description="versioned state file (lifecycle, trays powered "
        "off by safety requests, last validation); relative: in $STATE_DIRECTORY or the "
        "working directory"
    )
    initial_state: LifecycleState = Field("provisioning", description="state of a new rack")


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
    min_backend_fraction: float = Field(0.3, gt=0, le=1, description="NIC throughput in the "
                                        "backend phase >= this share of line rate")
    max_nvlink_fraction_backend: float = Field(0.01, ge=0, le=1, description="NVLink "
                                               "throughput in the backend phase <= this")


def _default_commands() -> CommandSettings:
    return CommandSettings(users={"valvey": "automation"})


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
    commands: CommandSettings = Field(
        default_factory=_default_commands,
        description="command path: roles of broker users (valvey = automation, CONTRACTS.md)",
    )

    @model_validator(mode="after")
    def _cross(self) -> RackyConfig:
        names = [s.name for s in self.power_shelves]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"power_shelves: duplicate names {dup}")
        for tray in self.power.tray_classes:
            if int(tray) >= self.node_agents.trays:
                raise ValueError(f"power.tray_classes: tray {tray} >= node_agents.trays")
        return self

    @property
    def command_user(self) -> str:
        """The <user> level racky sends node-agent commands under."""
        return self.node_agents.user or self.mqtt.username or "racky"


def state_path(p: Path, environ: dict[str, str] | None = None) -> Path:
    """A racky file path: absolute as given; relative inside ``$STATE_DIRECTORY`` (first entry)
    under systemd, else the working directory."""
    return in_state_directory(p, environ)
