"""racky's link-health settings (`[links]`, `[traffic]`): counter widths and reset rules, the
flap, zero-rate, error-rate (learned-baseline CUSUM), BER and shared-part rules, and the
observable irregular-traffic rules (`racky.core.links`, docs/RACKY.md §S7-S8)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rackplane.config import StrictModel

__all__ = ["MAX_RATE_64BIT_PER_S", "LinkSettings", "TrafficSettings"]

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
    bin_s: float = Field(60.0, ge=1, le=3600, description="count bin of the sequential "
                         "test, s (REF §3.3: 1-minute bins); within [1, 3600]: below 1 s a bin "
                         "is shorter than a counter poll, above an hour a rise takes most of a "
                         "day to judge")
    rate_learned: bool = Field(
        True, description="judge each link's pre-FEC rate against its own learned baseline "
        "(racky.core.linkrate: negative-binomial CUSUM, issue 22); false: the fixed-λ0 Poisson "
        "CUSUM above (healthy_rate_per_min, cusum_*) raises the alarm")
    rate_ratio: float = Field(3.0, gt=1, le=20, description="learned design: the CUSUM is "
                              "tuned to detect a rise to this multiple of the link's baseline")
    rate_h: float = Field(18.0, gt=0, le=100, description="learned design: decision interval, "
                          "log-likelihood-ratio units (ARL0 grows ~e^h); with "
                          "rate_false_alarms_per_100k_link_days set, the reference point of "
                          "each link's own threshold")
    rate_false_alarms_per_100k_link_days: float | None = Field(
        0.2, ge=1e-4, le=1000, description="learned design: each link's threshold is set from its "
        "learned rate and variance/mean so its in-control average run length is 100,000 "
        "link-days over this (Markov-chain calculation, docs/RACKY.md §S8), within "
        "[rate_h_min, rate_h_max]; unset: rate_h for every link; within [1e-4, 1000] (run "
        "lengths of 1.4e12 to 1.4e5 one-minute bins: further out the thresholds would sit at "
        "rate_h_max or rate_h_min)")
    rate_h_min: float = Field(8.0, gt=0, le=100, description="learned design: lowest "
                              "per-link threshold")
    rate_h_max: float = Field(30.0, gt=0, le=100, description="learned design: highest "
                              "per-link threshold")
    rate_dispersion_max: float = Field(
        2.0, ge=1, le=10, description="learned design: the largest variance/mean of 1-minute "
        "counts the statistic allows for (each link's own, learned, is used up to this)")
    baseline_warmup_min: float = Field(
        2880.0, ge=1, le=43200, description="learned baseline: plain mean over this many learnt "
        "minutes, then an exponentially weighted mean with baseline_tau_min")
    baseline_min_min: float = Field(120.0, ge=1, description="learned baseline: minutes "
                                    "learnt before the link is judged")
    baseline_tau_min: float = Field(10080.0, ge=60, description="learned baseline: time "
                                    "constant after the warm-up, min (slow: a creep is not "
                                    "absorbed; learning also stops while the statistic is "
                                    "off zero)")
    baseline_z_margin: float = Field(1.5, ge=0, le=5, description="learned baseline: judged "
                                     "against the estimate plus this many standard errors (of "
                                     "the rate, and of the variance/mean)")
    baseline_floor_per_min: float = Field(0.05, gt=0, description="learned baseline: lowest "
                                          "rate judged against, errors/min")
    part_grouping: bool = Field(
        True, description="errors rising together on the ports of one shared part (switch "
        "tray, a GPU's NIC, the parts below) are one link_part_errors finding naming the part "
        "(pooled learned CUSUM per part), not one alarm per port")
    nvlink_ports_per_switch_tray: int = Field(
        2, ge=0, le=72, description="NVLink port j of every GPU is on switch tray j // this "
        "(NVL72: 18 ports per GPU over 9 switch trays); 0: no switch-tray parts")
    parts: dict[str, list[str]] = Field(
        default_factory=dict, description="more shared parts: name -> port-name patterns "
        "(fnmatch, e.g. cable-a3 = ['gpu0[0-3]/nvl05']); a port may be in several parts")
    baseline_cap_per_min: float = Field(
        5.0, gt=0, le=600, description="learned baseline: highest healthy rate, errors/min; a "
        "link learns nothing above it (a link faulty when first seen is judged against it); "
        "at most 600 (10/s: the fast-rate rule's NVSentinel limit, a failed link, not a "
        "healthy one; the threshold grid grows with ln(cap/floor))")
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
            if not _COUNTER_RE.fullmatch(spec):
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
        if self.baseline_min_min > self.baseline_warmup_min:
            raise ValueError("baseline_min_min must be at most baseline_warmup_min")
        if self.baseline_cap_per_min < self.baseline_floor_per_min:
            raise ValueError("baseline_cap_per_min must be at least baseline_floor_per_min")
        return self


class TrafficSettings(StrictModel):
    """Irregular traffic judged from what the ports show (issue 22): a port against the other
    ports of its kind on its GPU (NVLink traffic is striped over all of a GPU's links), a GPU
    against its peers in the rack when they move in a synchronised phase (a collective), a
    single port against its own recent pattern. Never against a workload figure no agent can
    measure; unsynchronised peers (agentic bursts, variable concurrency) raise nothing."""

    enabled: bool = True
    min_expected_fraction: float = Field(0.05, gt=0, le=1, description="a reference (the "
                                         "siblings', peers' or own recent throughput) below "
                                         "this share of line rate judges nothing")
    silent_fraction: float = Field(0.1, gt=0, lt=1, description="below this share of its "
                                   "reference a port (or GPU) is silent")
    silent_for_s: float = Field(30.0, ge=0)
    stall_for_s: float = Field(10.0, ge=0)
    burst_excess: float = Field(0.5, gt=0, description="a GPU above its synchronised peers' "
                                "median × (1 + this) + 5 % of line = a burst")
    burst_for_s: float = Field(10.0, ge=0)
    sync_spread: float = Field(0.25, gt=0, le=1, description="peers are in a synchronised "
                               "phase when the median absolute deviation of their throughput "
                               "is at most this share of its median (only then are a GPU's "
                               "stall and burst judged against them)")
    pattern_tau_s: float = Field(300.0, gt=0, description="a port's own recent pattern: its "
                                 "throughput exponentially averaged over this, s")
