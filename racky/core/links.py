"""Link health of a rack, vectorised over every port (pure; REFERENCE §3.1-§3.3, §8).

One `LinkHealth.step` per tick takes the rack's `racky.core.telemetry.LinkFrame` (the latest read
of every port) and returns the alarm conditions, with a constant number of numpy calls
whatever the port count (1,440 on an NVL72):

1. **Counters** (`rackplane.core.detect.CounterDeltas`, FIELD-CASES BR-11): deltas right across
   wraps, resets told by the GPU's uptime or boot id, never a negative rate. A saturating
   counter (any width, 8 to 64 bits) that reaches its maximum gives a **lower bound** on its
   events (>= the step seen), which feeds the flap, zero-rate, rate and BER rules (a 1-minute
   bin holding such a step is its bound); reads still at the maximum add no known events and
   leave the rate unknown (never "0, healthy"). ``counter_unknown`` (warning) holds from the
   read at the maximum (or an implausible read) until a read of that counter below it (a
   reset) or plausible arrives, not only on ticks with a fresh message.
2. **Transitions** between two reads: the larger of the polled state change and the
   ``carrier_changes`` delta (a link that bounced between two reads both saying "up" still
   counts, BR-13 b); **link-downs**: the larger of a polled UP→DOWN and the ``link_downed``
   delta.
3. **Flapping** (``link_flapping``, critical): `rackplane.core.detect.WindowCountRule` over the
   configured events (NVSentinel: 3 link-downs in 10 min; BR-13: 4 transitions in 60 s, quiet
   300 s), or'ed with a decaying `rackplane.core.detect.FlapScore`; one alarm per incident.
   **Port dropped** (``port_dropped``, critical): DOWN held ``port_drop_s`` (NVSentinel 4 min).
4. **Zero-healthy-rate counters** (``link_errors``, major): DCGM's "any rise within 60 s"
   (NVLink replay, recovery, CRC-data; IB link-error-recovery, port-rcv). An NVLink recovery
   counted by the read that sees the link come back up is its retrain: part of the link
   incident, not a second alarm.
5. **Non-zero healthy rate** (pre-FEC symbol / CRC-flit; ``link_error_rate``, major): a
   per-link Poisson CUSUM on 1-minute counts (never "> 0") plus a fast rate threshold
   (NVSentinel ``symbol_error`` > 10/s); a "watch" flag from the two-stage design's lower
   threshold goes to the state, not to an alarm. **BER** (``link_ber``,
   major): pre-FEC errors over line bits, exponentially windowed, above 1e-12 (IBTA).
6. **Traffic** (``port_silent``, ``gpu_stalled``, ``gpu_burst``), from what the ports show
   (`racky.config.TrafficSettings`): a port against the other ports of its kind on its GPU
   (NVLink traffic is striped over a GPU's links) or, alone of its kind, against its own
   recent pattern while its GPU keeps communicating; a GPU against its rack peers, only
   while they move in a synchronised phase (a collective): unsynchronised peers (agentic
   bursts, variable concurrency) judge nothing. No workload figure is read.

Ports the caller marks ``expected_down`` (a tray racky switched off) raise nothing, and the
events of ports in ``grace`` (a tray just switched, a GPU rebooted) are not counted: a planned
power cycle is not a flap. Errors on a port already flapping or dropped are part of that
incident (one alert per incident).

The shadow static rules of §3.3 (60-minute window > 120 errors; ``rate[5m] > 2/min for 5m``)
run beside the CUSUM on the same bins, for the comparison figures only (`first_raise`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from rackplane.core.detect import (
    BinAccumulator,
    CounterDeltas,
    CounterStatus,
    EventWindow,
    FlapScore,
    PoissonCusum,
    RateFor,
    VectorThreshold,
    WindowCountRule,
    WindowSum,
)
from racky.core.alarmbank import AlarmKind
from racky.core.linkframe import LinkFrame
from racky.core.linkparts import PartGrouper, part_members
from racky.core.linkrate import LearnedRateCusum, RateDesign
from racky.link_settings import LinkSettings, TrafficSettings

__all__ = ["LINK_ALARM_KINDS", "LinkHealth", "LinkStep", "rate_design"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

def rate_design(cfg: LinkSettings) -> RateDesign:
    """The learned-baseline design of ``[links]`` in counts per bin (``bin_s``)."""
    b = cfg.bin_s / 60.0
    return RateDesign(
        ratio=cfg.rate_ratio, h=cfg.rate_h, dispersion=cfg.rate_dispersion_max,
        warmup_bins=max(1, round(cfg.baseline_warmup_min / b)),
        min_bins=max(1, round(cfg.baseline_min_min / b)),
        tau_bins=max(1.0, cfg.baseline_tau_min / b), z_margin=cfg.baseline_z_margin,
        z_dispersion=cfg.baseline_z_margin,
        floor=cfg.baseline_floor_per_min * b, cap=cfg.baseline_cap_per_min * b,
        initial=min(max(cfg.healthy_rate_per_min, cfg.baseline_floor_per_min),
                    cfg.baseline_cap_per_min) * b,
        arl0_bins=(None if cfg.rate_false_alarms_per_100k_link_days is None
                   else 1e5 * 86400.0 / cfg.bin_s / cfg.rate_false_alarms_per_100k_link_days),
        h_min=min(cfg.rate_h_min, cfg.rate_h_max), h_max=cfg.rate_h_max)


def _z(x: FloatArray) -> FloatArray:
    """NaN -> 0 (cheaper than numpy.nan_to_num, which also handles infinities)."""
    out: FloatArray = np.where(np.isnan(x), 0.0, x)
    return out


LINK_ALARM_KINDS: tuple[AlarmKind, ...] = (
    AlarmKind("link_flapping", "critical", "link {thing} is flapping ({detail})",
              runbook="link-flapping"),
    AlarmKind("port_dropped", "critical", "link {thing} is down ({detail})",
              runbook="port-dropped"),
    AlarmKind("link_errors", "major", "link {thing}: errors on counters that are zero when "
              "healthy ({detail})", runbook="link-errors"),
    AlarmKind("link_error_rate", "major", "link {thing}: pre-FEC error rate above its healthy "
              "rate ({detail})", runbook="link-error-rate"),
    AlarmKind("link_part_errors", "major", "{thing}: pre-FEC errors rising together on its "
              "ports ({detail})", runbook="link-error-rate"),
    AlarmKind("link_ber", "major", "link {thing}: pre-FEC BER above the limit ({detail})",
              runbook="link-ber"),
    AlarmKind("counter_unknown", "warning", "link {thing}: counter rate unknown ({detail})"),
    AlarmKind("port_silent", "minor", "link {thing} carries no traffic while its GPU's other "
              "ports (or its own recent pattern) carry some ({detail})"),
    AlarmKind("gpu_stalled", "major", "{thing}: no traffic on any port while its peers in a "
              "synchronised phase carry traffic ({detail})"),
    AlarmKind("gpu_burst", "warning", "{thing}: traffic well above its synchronised peers' "
              "({detail})"),
    AlarmKind("cable_hot", "major", "link {thing}: cable/transceiver temperature high "
              "({detail})"),
)


@dataclass
class LinkStep:
    """What one step decided.

    ``conditions``: alarm kind -> {thing: value} for every condition true now (things are port
    names, or GPU names for the per-GPU kinds); ``details``: kind -> {thing: text}.
    ``summary``: counts for the state topic. ``watch``: ports on the CUSUM's watch list.
    """

    conditions: dict[str, dict[str, float | None]] = field(default_factory=dict)
    details: dict[str, dict[str, str]] = field(default_factory=dict)
    summary: dict[str, int | float] = field(default_factory=dict)
    watch: list[str] = field(default_factory=list)
    bin_closed: bool = False


class LinkHealth:
    """Per-port link detectors of one rack (see the module docstring).

    Args:
        cfg: `LinkSettings`; traffic: `TrafficSettings`.
        frame: the rack's link frame (its layout and counter rows are taken from it).
        stale_after_s: a port's last read counts as its current state for this long, s
            (config ``node_agents.stale_after_s``). The debounced detectors (port dropped,
            fast rate, traffic, cable temperature) see that held state on ticks without a new
            read, and "no information" (their on-delay restarts) only once it is stale: with
            telemetry slower than the tick a down port is still declared dropped, and a silent
            tray's last values are never taken as current.
    """

    def __init__(self, cfg: LinkSettings, traffic: TrafficSettings, frame: LinkFrame,
                 stale_after_s: float = 5.0) -> None:
        if not (math.isfinite(stale_after_s) and stale_after_s > 0):
            raise ValueError("stale_after_s must be finite and > 0")
        self.stale_after_s = float(stale_after_s)
        self.cfg = cfg
        self.tcfg = traffic
        self.names = list(frame.names)
        n = self.n = frame.n_ports
        self.n_gpus = frame.n_gpus
        self.ppg = frame.ports_per_gpu
        self.gpu = frame.gpu.copy()
        used = [*cfg.zero_rate_counters, cfg.pre_fec_nvlink, cfg.pre_fec_nic, "link_downed",
                "carrier_changes"]
        if "nvl_recovery_errors" in frame.counter_names:
            used.append("nvl_recovery_errors")
        missing = [u for u in used if u not in frame.counter_names]
        if missing:
            raise ValueError(f"the link frame lacks counters {missing}")
        self.counter_names = tuple(dict.fromkeys(used))  # the counters the detectors use
        self._frame_rows = np.array([frame.counter_names.index(x) for x in self.counter_names])
        c = len(self.counter_names)
        specs = [cfg.counter_spec(name) for name in self.counter_names]
        self._ctr = CounterDeltas(
            c * n,
            bits=np.repeat([s[0] for s in specs], n),
            saturating=np.repeat([s[1] for s in specs], n),
            max_rate_per_s=np.repeat([s[2] for s in specs], n),
            uptime_tolerance_s=cfg.uptime_tolerance_s,
        )
        self._row = {name: i for i, name in enumerate(self.counter_names)}
        self._ctr_max = self._ctr.max_value.reshape(c, n)
        self._ctr_sat = self._ctr.saturating.reshape(c, n)
        # held per counter until the next read of it: at a saturating counter's maximum, or
        # implausible (14.3: the alarm holds between telemetry messages)
        self._unknown = np.zeros((c, n), dtype=bool)
        self._unknown_sat = np.zeros((c, n), dtype=bool)
        self._flap = WindowCountRule(n, cfg.flap_count, cfg.flap_window_s, cfg.flap_quiet_s)
        self._score = FlapScore(n, cfg.flap_score_penalty, cfg.flap_score_half_life_s,
                                cfg.flap_score_raise_at, cfg.flap_score_clear_below,
                                cfg.flap_score_hold_down_s) if cfg.flap_score else None
        self._drop = VectorThreshold(n, 0.5, 0.0, on_delay_s=cfg.port_drop_s)
        self._zero_rows = [self._row[x] for x in cfg.zero_rate_counters]
        self._zero = EventWindow(len(self._zero_rows) * n, cfg.zero_rate_window_s)
        bin_min = cfg.bin_s / 60.0
        l0 = cfg.healthy_rate_per_min * bin_min
        l1 = cfg.cusum_lambda1_per_min * bin_min
        self._bins = BinAccumulator(n, cfg.bin_s)
        self._bins_lb = BinAccumulator(n, cfg.bin_s)  # lower bounds where a counter saturated
        self._bin_sat = np.zeros(n, dtype=bool)  # the open bin holds a saturation step
        self._cusum = PoissonCusum(n, l0, l1, cfg.cusum_h, watch_h=cfg.cusum_watch_h)
        self._learned = LearnedRateCusum(n, rate_design(cfg))
        self._fallback = np.zeros(n, dtype=bool)  # fixed-design alarm of a link still learning
        self._parts_key: tuple[bytes, tuple[str, ...]] | None = None
        self._grouper: PartGrouper | None = None
        w60 = max(1, round(3600.0 / cfg.bin_s))
        w5 = max(1, round(300.0 / cfg.bin_s))
        self._static = {
            "window_60min_gt_120": WindowSum(n, w60, 120.0),
            "rate_5m_gt_2pm_for_5m": RateFor(n, w5, 2.0 * bin_min, w5),
        }
        self.first_raise: dict[str, FloatArray] = {
            k: np.full(n, np.nan) for k in ("cusum", "learned", *self._static)
        }
        self._fast = VectorThreshold(n, cfg.fast_rate_per_s, 0.2 * cfg.fast_rate_per_s,
                                     on_delay_s=cfg.fast_rate_for_s)
        self._ber_e = np.zeros(n)
        self._ber_b = np.zeros(n)
        self._ber = VectorThreshold(n, cfg.ber_threshold, 0.5 * cfg.ber_threshold,
                                    on_delay_s=cfg.ber_for_s)
        self._cable = VectorThreshold(n, cfg.cable_temp_limit_c, 2.0, on_delay_s=5.0)
        t = traffic
        self._silent = VectorThreshold(n, 0.5, 0.0, on_delay_s=t.silent_for_s)
        self._stall = VectorThreshold(self.n_gpus, 0.5, 0.0, on_delay_s=t.stall_for_s)
        self._burst = VectorThreshold(self.n_gpus, 0.5, 0.0, on_delay_s=t.burst_for_s)
        self._is_nvlink = frame.is_nvlink.copy()
        self._pattern = np.full(n, np.nan)  # each port's recent throughput, share of line
        self._traffic_t: float | None = None
        self._silent_held = np.full(n, np.nan)
        self._last_t = np.full(n, np.nan)
        self._last_rate = np.full(n, np.nan)  # pre-FEC rate of the last read, per s
        self._prev_up = np.ones(n, dtype=bool)
        self._have_up = np.zeros(n, dtype=bool)
        self.pre_fec_rate_per_min = np.full(n, np.nan)  # last closed bin
        self.bins_closed = 0  # pre-FEC bins closed so far (a Python int: no wrap)
        self.last_status = np.zeros((c, n), dtype=np.int8)
        self.events_total = np.zeros(n, dtype=np.int64)

    # ------------------------------------------------------------------------------------

    def step(
        self,
        now: float,
        frame: LinkFrame,
        expected_down: BoolArray | None = None,
        grace: BoolArray | None = None,
    ) -> LinkStep:
        """One tick at monotonic ``now`` (see the module docstring).

        Args:
            frame: the rack's latest port reads (same layout as at construction).
            expected_down: ports that may be down (their tray was switched off).
            grace: ports whose events are not counted this tick (planned power cycles).
        """
        n = self.n
        if frame.n_ports != n:
            raise ValueError(f"frame has {frame.n_ports} ports, expected {n}")
        exp_down = np.zeros(n, dtype=bool) if expected_down is None else expected_down
        grace_m = np.zeros(n, dtype=bool) if grace is None else grace
        with np.errstate(invalid="ignore", divide="ignore"):
            return self._step(now, frame, exp_down, grace_m)

    def _step(self, now: float, frame: LinkFrame, exp_down: BoolArray, grace_m: BoolArray
              ) -> LinkStep:
        cfg, n = self.cfg, self.n
        t = frame.t_mono
        fresh = ~np.isnan(t) & (np.isnan(self._last_t) | (t > self._last_t))
        current = ~np.isnan(t) & (now - t <= self.stale_after_s)  # the last read still holds
        dt = np.where(fresh & ~np.isnan(self._last_t), t - self._last_t, np.nan)
        self._last_t = np.where(fresh, t, self._last_t)
        c = len(self.counter_names)
        present = np.tile(fresh, c) & frame.counter_seen[self._frame_rows].ravel()
        st = self._ctr.update(frame.counters[self._frame_rows].ravel(), np.tile(t, c), present,
                              uptime_s=np.tile(frame.uptime_s, c),
                              boot_id=np.tile(frame.boot_id, c))
        delta = st.delta.reshape(c, n)
        status = st.status.reshape(c, n)
        self.last_status = status
        # a saturating counter that reached its maximum: the step seen is a lower bound on the
        # events (>= max - previous); later reads still at the maximum add nothing known (0 as
        # a bound, never "0, healthy": the rate stays unknown). Events use the bound.
        sat = status == CounterStatus.SATURATED
        lb = st.lower_bound.reshape(c, n)
        sat_step = sat & (lb > 0)
        eff = np.where(sat, lb, delta)
        fresh_c = present.reshape(c, n)
        at_max = self._ctr_sat & (frame.counters[self._frame_rows] == self._ctr_max)
        self._unknown_sat = np.where(fresh_c, at_max, self._unknown_sat)
        self._unknown = np.where(fresh_c, at_max | (status == CounterStatus.IMPLAUSIBLE),
                                 self._unknown)
        rebooted = (status == CounterStatus.RESET).any(axis=0)
        quiet = grace_m | exp_down | rebooted

        # 2. transitions and link-downs
        up = frame.link_up
        polled = fresh & self._have_up
        changed = polled & (up != self._prev_up)
        went_down = changed & ~up
        came_up = changed & up
        self._prev_up = np.where(fresh, up, self._prev_up)
        self._have_up |= fresh
        cc = _z(eff[self._row["carrier_changes"]])
        ld = _z(eff[self._row["link_downed"]])
        transitions = np.maximum(cc, changed.astype(np.float64))
        downs = np.maximum(ld, went_down.astype(np.float64))
        ups = np.maximum(np.maximum(transitions - downs, 0.0), came_up.astype(np.float64))
        events = downs if cfg.flap_events == "link_downs" else transitions
        events = np.where(fresh & ~quiet, events, 0.0)
        self.events_total += events.astype(np.int64)

        # 3. flapping and port drop
        flapping = self._flap.update(now, events)
        if self._score is not None:
            flapping |= self._score.update(now, events)
        down_val = np.where(current, np.where(up | exp_down, 0.0, 1.0), np.nan)
        dropped = self._drop.update(now, down_val) & ~exp_down
        incident = flapping | dropped

        # 4. zero-healthy-rate counters (retrains of an NVLink coming up are explained)
        zr = _z(eff[self._zero_rows])
        rec = self.counter_names.index("nvl_recovery_errors") if (
            "nvl_recovery_errors" in self.counter_names) else -1
        for i, r in enumerate(self._zero_rows):
            if r == rec:
                zr[i] = np.maximum(zr[i] - ups * frame.is_nvlink, 0.0)
        zr = np.where(quiet[None, :], 0.0, zr)
        zero_on = self._zero.update(now, zr.ravel()).reshape(len(self._zero_rows), n)
        zero_port = zero_on.any(axis=0) & ~incident

        # 5. pre-FEC: CUSUM on 1-minute bins, fast rate, BER
        pre_rows = np.where(frame.is_nvlink, self._row[cfg.pre_fec_nvlink],
                            self._row[cfg.pre_fec_nic])
        self._is_nvlink = frame.is_nvlink.copy()
        self._regroup(frame)
        cols = np.arange(n)
        pre_exact = delta[pre_rows, cols]
        pre_sat = sat_step[pre_rows, cols]
        pre = np.where(pre_sat, lb[pre_rows, cols], pre_exact)  # NaN: unknown
        pre_dt = np.where(fresh, dt, np.nan)
        pre_in = np.where(quiet, np.nan, pre_exact)
        closed = self._bins.add(now, pre_in, pre_dt, present=fresh)
        # the same bins as lower bounds (unknown deltas 0, a saturation step its bound): a bin
        # with an unknown delta is that bound when a saturation step fed it, else unknown
        lb_in = np.where(quiet, np.nan, np.where(np.isnan(pre), 0.0, pre))
        self._bin_sat |= pre_sat & ~quiet
        closed_lb = self._bins_lb.add(now, lb_in, pre_dt, present=fresh)
        step = LinkStep()
        bound = np.zeros(n, dtype=bool)
        if closed is not None and closed_lb is not None:
            bound = np.isnan(closed) & self._bin_sat & (closed_lb > 0)
            closed = np.where(bound, closed_lb, closed)
            self._bin_sat = np.zeros(n, dtype=bool)
        if closed is not None:
            step.bin_closed = True
            self.pre_fec_rate_per_min = closed * (60.0 / cfg.bin_s)
            self.bins_closed += 1
            unarmed = ~self._learned.armed
            # a link still learning is judged by the configured fixed design meanwhile, and
            # learns nothing while that statistic is off zero (a link new with a fault)
            hold = unarmed & (self._cusum.s > 0.0)
            self._cusum.update(closed)
            self._learned.update(closed, lower_bound=bound, hold=hold)
            self._fallback = np.where(unarmed, self._cusum.state,
                                      self._fallback & self._cusum.state)
            if self._grouper is not None:
                self._grouper.update_bin(closed, bound)
            for key, rose in (("cusum", self._cusum.raised), ("learned", self._learned.raised)):
                fr = self.first_raise[key]
                self.first_raise[key] = np.where(rose & np.isnan(fr), now, fr)
            for name, det in self._static.items():
                det.update(closed)
                rr = det.raised
                fr = self.first_raise[name]
                self.first_raise[name] = np.where(rr & np.isnan(fr), now, fr)
        self._last_rate = np.where(fresh, np.where(quiet, np.nan, pre / dt), self._last_rate)
        rate = np.where(current & ~quiet, self._last_rate, np.nan)
        fast = self._fast.update(now, rate)
        seq = self._learned if cfg.rate_learned else self._cusum
        seq_state = (self._learned.state | self._fallback) if cfg.rate_learned else (
            self._cusum.state)
        rate_alarm = (seq_state | fast) & ~incident
        parts: dict[str, list[int]] = {}
        if self._grouper is not None and cfg.rate_learned:
            parts, folded = self._grouper.findings(
                self._learned.state & ~incident,
                (self._learned.s > 0.5 * self._learned.h) & ~incident, self._learned.s,
                self._learned.h)
            rate_alarm &= ~folded
        tau = cfg.ber_window_s
        dtz = _z(pre_dt)
        decay = np.exp(-dtz / tau)
        bits = frame.speed_mb_per_s * 8e6 * dtz * up
        ok_pre = fresh & ~np.isnan(pre) & ~quiet
        self._ber_e = np.where(ok_pre, self._ber_e * decay + _z(pre), self._ber_e)
        self._ber_b = np.where(ok_pre, self._ber_b * decay + bits, self._ber_b)
        min_bits = 10.0 / cfg.ber_threshold
        ber = np.where(self._ber_b >= min_bits, self._ber_e / self._ber_b, np.nan)
        ber_on = self._ber.update(now, ber) & ~incident
        unknown: BoolArray = np.asarray(self._unknown.any(axis=0), dtype=bool)
        cable = self._cable.update(now, np.where(current, frame.cable_temp_c, np.nan))

        # 6. traffic vs what the workload implies
        silent_p, stall_g, burst_g = self._traffic(now, frame, current, up, exp_down)
        silent_p &= ~incident

        names = self.names
        gname = [f"gpu{g:02d}" for g in range(self.n_gpus)]

        def pick(m: BoolArray, vals: FloatArray | None = None) -> dict[str, float | None]:
            idx = np.flatnonzero(m)
            return {names[i]: (None if vals is None or np.isnan(vals[i]) else float(vals[i]))
                    for i in idx}

        in_win = self._flap.in_window(now) if flapping.any() else np.zeros(n, dtype=np.int64)
        step.conditions = {
            "link_flapping": pick(flapping, in_win.astype(np.float64)),
            "port_dropped": pick(dropped),
            "link_errors": pick(zero_port),
            "link_error_rate": pick(rate_alarm, seq.s),
            "link_part_errors": {part: float(len(ports)) for part, ports in parts.items()},
            "link_ber": pick(ber_on, ber),
            "counter_unknown": pick(unknown),
            "port_silent": pick(silent_p),
            "gpu_stalled": {gname[g]: None for g in np.flatnonzero(stall_g)},
            "gpu_burst": {gname[g]: None for g in np.flatnonzero(burst_g)},
            "cable_hot": pick(cable, frame.cable_temp_c),
        }
        ev_word = "link-downs" if cfg.flap_events == "link_downs" else "transitions"
        step.details = {
            "link_flapping": {names[i]: f"{int(in_win[i])} {ev_word} within "
                              f"{cfg.flap_window_s:g} s" for i in np.flatnonzero(flapping)},
            "port_dropped": {names[i]: f"down >= {cfg.port_drop_s:g} s"
                             for i in np.flatnonzero(dropped)},
            "link_errors": {names[i]: ", ".join(
                self.counter_names[r] for k, r in enumerate(self._zero_rows) if zero_on[k, i])
                for i in np.flatnonzero(zero_port)},
            "link_error_rate": {names[i]: (self._rate_text(int(i)) if seq_state[i] else "rate > "
                                           f"{cfg.fast_rate_per_s:g}/s")
                                for i in np.flatnonzero(rate_alarm)},
            "link_part_errors": {part: f"pooled CUSUM of its ports; hot: "
                                 f"{', '.join(names[i] for i in ports) or 'none alone'}"
                                 for part, ports in parts.items()},
            "link_ber": {names[i]: f"{ber[i]:.2g} > {cfg.ber_threshold:g}"
                         for i in np.flatnonzero(ber_on)},
            "counter_unknown": {names[i]: "; ".join(
                f"{self.counter_names[r]} "
                + ("at its maximum (saturated: events since are a lower bound)"
                   if self._unknown_sat[r, i] else "implausible")
                for r in range(c) if self._unknown[r, i]) for i in np.flatnonzero(unknown)},
        }
        watch = (self._learned.s > 0.5 * self._learned.h) if cfg.rate_learned else (
            self._cusum.watch)
        step.watch = [names[i] for i in np.flatnonzero(watch & ~seq_state)]
        step.summary = {
            "ports": n,
            "ports_reporting": int((~np.isnan(self._last_t)).sum()),
            "ports_up": int((up & ~np.isnan(self._last_t)).sum()),
            "flapping": int(flapping.sum()),
            "dropped": int(dropped.sum()),
            "error_rate": int(rate_alarm.sum()),
            "zero_rate_errors": int(zero_port.sum()),
            "watch": len(step.watch),
            "counters_unknown": int(unknown.sum()),
            "counters_reset": int((status == CounterStatus.RESET).sum()),
            "counters_wrapped": int((status == CounterStatus.WRAP).sum()),
            "cusum_max": float(seq.s.max()) if n else 0.0,
        }
        return step

    def _regroup(self, frame: LinkFrame) -> None:
        """(Re)build the shared parts when the port layout learnt from telemetry changed
        (trays arrive one by one: a port's kind and name are known from its first read)."""
        if not self.cfg.part_grouping:
            return
        key = (frame.is_nvlink.tobytes(), tuple(frame.names) if self.cfg.parts else ())
        if key == self._parts_key:
            return
        self._parts_key = key
        members = part_members(frame.names, frame.is_nvlink, frame.ports_per_gpu,
                               self.cfg.nvlink_ports_per_switch_tray, self.cfg.parts)
        self._grouper = PartGrouper(members, self.n, self._learned.d)

    def rate_designs(self) -> list[RateDesign]:
        """The learned-rate designs in use: the per-port one, and the parts' pooled one
        once the parts are grouped (its ``cap`` scales with the largest part). Their
        threshold grids (`RateDesign.prepare_grid`) are what a caller computes off its
        event loop."""
        out = [self._learned.d]
        if self._grouper is not None:
            out.append(self._grouper.det.d)
        return out

    def _rate_text(self, i: int) -> str:
        per_min = 60.0 / self.cfg.bin_s
        if not self.cfg.rate_learned:
            return "CUSUM"
        if self._fallback[i] and not self._learned.state[i]:
            return (f"CUSUM against the configured healthy rate "
                    f"{self.cfg.healthy_rate_per_min:g}/min (own baseline not learnt yet)")
        return (f"CUSUM against its own baseline {self._learned.lambda0[i] * per_min:.3g}/min "
                f"(last minute {self.pre_fec_rate_per_min[i]:.3g}/min)")

    @property
    def baseline_version(self) -> int:
        """Changes whenever the learned baselines changed (persist them then)."""
        return self._learned.folds

    def export_baselines(self) -> dict[str, dict[str, float]]:
        """The learned pre-FEC baselines to persist: ``"<port>:<counter>"`` ->
        ``{"baseline_per_min", "learned_min", "dispersion"}`` (variance/mean of the 1-minute
        counts; ports with nothing learnt are left out)."""
        per_min = 60.0 / self.cfg.bin_s
        st = self._learned.export()
        out: dict[str, dict[str, float]] = {}
        for i in np.flatnonzero(st["learned"] > 0):
            out[self._baseline_key(int(i))] = {
                "baseline_per_min": float(st["baseline"][i] * per_min),
                "learned_min": float(st["learned"][i] / per_min),
                "dispersion": float(st["dispersion"][i])}
        return out

    def restore_baselines(self, saved: dict[str, Any]) -> int:
        """Take back `export_baselines`' document (keys of other ports or counters, and bad
        values, are ignored: that port learns afresh). Returns the ports restored."""
        per_min = 60.0 / self.cfg.bin_s
        base = np.full(self.n, np.nan)
        learned = np.zeros(self.n)
        disp = np.full(self.n, np.nan)
        for i in range(self.n):
            v = saved.get(self._baseline_key(i))
            if not isinstance(v, dict):
                continue
            b, k = v.get("baseline_per_min"), v.get("learned_min")
            if isinstance(b, int | float) and isinstance(k, int | float) and not isinstance(
                    b, bool) and not isinstance(k, bool):
                base[i] = float(b) / per_min
                learned[i] = float(k) * per_min
                ph = v.get("dispersion")
                if isinstance(ph, int | float) and not isinstance(ph, bool):
                    disp[i] = float(ph)
        self._learned.restore(base, learned, disp)
        return int((self._learned.learned > 0).sum())

    def _baseline_key(self, i: int) -> str:
        ctr = self.cfg.pre_fec_nvlink if self._is_nvlink[i] else self.cfg.pre_fec_nic
        return f"{self.names[i]}:{ctr}"

    def _traffic(self, now: float, f: LinkFrame, fresh: BoolArray, up: BoolArray,
                 exp_down: BoolArray) -> tuple[BoolArray, BoolArray, BoolArray]:
        """Irregular traffic from what the ports show (`TrafficSettings`): returns (silent
        ports, stalled GPUs, bursting GPUs), each after its on-delay."""
        t = self.tcfg
        n_g, ppg = self.n_gpus, self.ppg
        if not t.enabled:
            z = np.zeros(self.n, dtype=bool)
            return z, np.zeros(n_g, dtype=bool), np.zeros(n_g, dtype=bool)
        line = f.speed_mb_per_s * 1e6
        ok = fresh & up & ~exp_down & (line > 0)
        u = np.where(ok, 0.5 * (f.tx_bytes_per_s + f.rx_bytes_per_s) / np.where(
            line > 0, line, 1.0), np.nan)  # share of line rate, NaN: not judged
        # 1. a port against the other ports of its kind on its GPU (median, >= 2 of them)
        sib = np.full(self.n, np.nan)
        for kind in (True, False):
            m = (f.is_nvlink == kind).reshape(n_g, ppg)
            v = np.where(m, u.reshape(n_g, ppg), np.nan)
            cnt = (~np.isnan(v)).sum(axis=1)
            med = np.full(n_g, np.nan)
            if (cnt >= 2).any():
                med[cnt >= 2] = np.nanmedian(v[cnt >= 2], axis=1)
            sib = np.where(m.ravel(), np.repeat(med, ppg), sib)
        # 2. a port against its own recent pattern while its GPU's other ports keep theirs
        dt = 0.0 if self._traffic_t is None else max(0.0, now - self._traffic_t)
        self._traffic_t = now
        a = 1.0 - math.exp(-dt / t.pattern_tau_s) if dt > 0 else 0.0
        first = np.isnan(self._pattern)
        self._pattern = np.where(ok, np.where(first, u, self._pattern + a * (u - self._pattern)),
                                 self._pattern)
        busy = ~np.isnan(sib) & (sib >= t.min_expected_fraction)
        quiet_vs_sib = busy & (u < t.silent_fraction * sib)
        alone = np.isnan(sib) & (self._pattern >= t.min_expected_fraction)
        gpu_u = np.bincount(self.gpu, weights=np.where(ok, u, 0.0), minlength=n_g) / np.maximum(
            np.bincount(self.gpu, weights=ok.astype(np.float64), minlength=n_g), 1.0)
        quiet_vs_own = alone & (u < t.silent_fraction * self._pattern) & (
            gpu_u[self.gpu] >= t.min_expected_fraction)
        silent = ok & (quiet_vs_sib | quiet_vs_own)
        judged = ok & (busy | alone)
        # while its GPU pauses (agentic work comes and goes) a port keeps its last judgement:
        # a port silent through the GPU's busy spells is found however short they are
        self._silent_held = np.where(judged, silent.astype(np.float64),
                                     np.where(ok, self._silent_held, np.nan))
        s_on = self._silent.update(now, self._silent_held)
        # 3. a GPU against its peers in the rack, only while they are synchronised
        any_ok = np.bincount(self.gpu, weights=ok.astype(np.float64), minlength=n_g) > 0
        peers = gpu_u[any_ok]
        stall_raw = np.full(n_g, np.nan)
        burst_raw = np.full(n_g, np.nan)
        if peers.size >= 3:
            pm = float(np.median(peers))
            mad = float(np.median(np.abs(peers - pm)))
            if pm >= t.min_expected_fraction and mad <= t.sync_spread * pm:
                stall_raw = np.where(any_ok, (gpu_u < t.silent_fraction * pm), np.nan)
                burst_raw = np.where(any_ok, gpu_u > pm * (1.0 + t.burst_excess) + 0.05,
                                     np.nan)
        stall = self._stall.update(now, stall_raw)
        burst = self._burst.update(now, burst_raw)
        return s_on & ~stall[self.gpu], stall, burst

    def port_figures(self) -> dict[str, FloatArray]:
        """Per-port figures for the time series: CUSUM statistic, last pre-FEC rate per min,
        flap events in the window, flap score (NaN without one)."""
        return {
            "cusum": (self._learned if self.cfg.rate_learned else self._cusum).s.copy(),
            "baseline_per_min": self._learned.lambda0 * (60.0 / self.cfg.bin_s),
            "pre_fec_per_min": self.pre_fec_rate_per_min.copy(),
            "flap_score": self._score.score if self._score is not None else np.full(self.n,
                                                                                     np.nan),
            "link_events_total": self.events_total.astype(np.float64),
        }
