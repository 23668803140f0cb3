"""The demo's checklist: what the run was meant to show, each item checked from what the run
recorded (`harness.demo.record.Recorder`), never printed unconditionally.

Items (`checklist`):

* each load step: back within ±0.5 K (`BAND_K`) inside its scoring window (the step figures,
  `harness.demo.summary.summarise`, windows cut at the next scripted fault);
* agentic bursts (a rack whose load is agentic: the row's burst rack): valvey's PV held
  within S2's targets, RMS error <= `BURST_RMS_K` and max |error| <= `BURST_MAX_K`, over the
  burst window (`harness.demo.bursts.burst_figures`, cut at the first scripted fault in it),
  the plant truth's figures beside them;
* each ``pump_trip`` fault: valvey raised ``pump_failover`` after the trip (its other pump
  alarms named beside it), and its ``state/pumps`` shows another pump as duty with its
  running bit on; the takeover time is the first such state after the trip;
* each ``link_flap`` fault: racky raised ``link_flapping`` on the port; the detection delay
  is counted from the flap's start and from its last down;
* the rack held out of production: in production when the flap began, then ``quarantined``
  by racky after its alarm, and at the end not in production and without a passed validation
  (so only a new validation returns it);
* no unexpected alarms: every alarm raised is explained by a scripted fault (raised between
  its start and its end + `ATTRIBUTION_S`, on its target: valvey's pump alarms for a pump
  trip, alarms naming the port for a link fault), or by what the run set up on purpose
  (``explained``: e.g. under rlc, racky's ``power_capped`` whose message says its limit came
  from its budget, rlc's lease: `harness.demo.fleet`).

An item that did not happen is unchecked and says what was seen instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from harness.demo.bursts import BURST_MAX_K, BURST_MIN_WINDOW_S, BURST_RMS_K, is_burst_load
from rackplane.core.names import alarm_id
from sims.scenario import FaultSpec, Scenario

__all__ = ["ATTRIBUTION_S", "CheckItem", "checklist", "fault_end_s", "fault_windows"]

ATTRIBUTION_S = 60.0
"""An alarm raised up to this long after a fault's end is attributed to it, s (as the
fault-coverage figures count a detection, docs/RACKY.md)."""
BAND_K = 0.5  # REFERENCE §5 S1: back within ±0.5 K
PUMP_ALARMS = ("pump_failover", "pump_redundancy_lost", "pump_no_standby")
"""valvey's pump alarms a pump trip explains (and ``pump_<name>_fault``)."""


@dataclass(frozen=True)
class CheckItem:
    """One line of the checklist: ``ok`` only when the run's data shows it."""

    label: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        return f"[{'x' if self.ok else ' '}] {self.label}: {self.detail}"


def fault_end_s(f: FaultSpec) -> float:
    """When a fault is over, plant s: ``until_s``, the last up of a flap, else its start."""
    if f.until_s is not None:
        return f.until_s
    if f.kind == "link_flap" and f.down_s is not None:
        return f.at_s + (f.count - 1) * (f.down_s + (f.up_s or 0.0)) + f.down_s
    if f.kind == "link_down" and f.down_s is not None:
        return f.at_s + f.down_s
    return f.at_s


def fault_windows(sc: Scenario) -> list[tuple[float, float, FaultSpec]]:
    """(start, end, fault) of the scenario's scripted faults, plant s."""
    return [(f.at_s, fault_end_s(f), f) for f in sc.faults]


def _fmt_t(t: float) -> str:
    return f"t = {t:.1f} s"


def _raised(rec: Any, pred: Any, t0: float, t1: float) -> tuple[float, str] | None:
    """The first alarm raised in [t0, t1] whose key satisfies ``pred``."""
    for t, key, kind in rec.alarm_log:
        if kind == "raised" and t0 <= t <= t1 and pred(key):
            return t, key
    return None


def _step_items(steps: Sequence[dict[str, Any]]) -> list[CheckItem]:
    out = []
    for st in steps:
        pv = st.get("valvey_pv")
        label = f"{st['disturbance']} at t = {st['t0_s']:g} s back within ±{BAND_K:g} K"
        window = f"scored over t = {st['t0_s']:g}-{st['t1_s']:.0f} s"
        if not pv:
            out.append(CheckItem(label, False, f"no valvey state in the window ({window})"))
            continue
        err, settle = pv["max_abs_error_k"], pv["settling_s"]
        if settle is None:
            out.append(CheckItem(label, False, f"max |error| {err:.2f} K, not back within "
                                               f"±{BAND_K:g} K by the window's end ({window})"))
        elif settle == 0:
            out.append(CheckItem(label, True, f"held: max |error| {err:.2f} K, never left the "
                                              f"band ({window})"))
        else:
            out.append(CheckItem(label, True, f"max |error| {err:.2f} K, back within the band "
                                              f"after {settle:.0f} s ({window})"))
    return out


def _burst_item(b: Mapping[str, Any] | None, end_t: float) -> CheckItem:
    """S2's targets on valvey's PV over the burst window (``b``: `burst_figures`' dict)."""
    if b is None:
        return CheckItem(f"agentic bursts held: supply RMS error <= {BURST_RMS_K:g} K and max "
                         f"|error| <= {BURST_MAX_K:g} K", False, "no burst figures for the run")
    t0, t1 = b["t0_s"], b["t1_s"]
    label = (f"agentic bursts held: supply RMS error <= {BURST_RMS_K:g} K and max |error| <= "
             f"{BURST_MAX_K:g} K over t = {t0:g}-{max(t1, t0):.0f} s")
    cut = f"; the window ends at the {b['cut_by']}" if b.get("cut_by") else ""
    pv, tr = b.get("valvey_pv"), b.get("plant_truth")
    if t1 - t0 < BURST_MIN_WINDOW_S:
        return CheckItem(label, False, f"not scored: the window is {max(t1 - t0, 0):.0f} s, "
                                       f"under {BURST_MIN_WINDOW_S:g} s (the run ended at t = "
                                       f"{end_t:.0f} s{cut})")
    if not pv:
        return CheckItem(label, False, f"no valvey state in the window{cut}")
    rms, mx = pv["rms_error_k"], pv["max_abs_error_k"]
    truth = ("no plant truth in the window" if not tr else
             f"plant truth RMS {tr['rms_error_k']:.2f} K, max |error| "
             f"{tr['max_abs_error_k']:.2f} K")
    ld = b.get("load")
    load = "" if not ld else (f"; rack load {ld['p5_w'] / 1000:.0f}-{ld['p95_w'] / 1000:.0f} kW "
                              f"p5-p95, max {ld['max_w'] / 1000:.0f} kW, largest rise "
                              f"{ld['largest_rise_w'] / 1000:.0f} kW")
    seen = (f"valvey's PV RMS {rms:.2f} K, max |error| {mx:.2f} K at t = "
            f"{pv['t_max_error_s']:.0f} s ({pv['samples']} states); {truth}{load}{cut}")
    missed = [x for x, bad in ((f"RMS above {BURST_RMS_K:g} K", rms > BURST_RMS_K),
                               (f"max |error| above {BURST_MAX_K:g} K", mx > BURST_MAX_K)) if bad]
    if missed:
        return CheckItem(label, False, f"not met ({' and '.join(missed)}): {seen}")
    return CheckItem(label, True, f"held: {seen}")


def _pump_trip_item(rec: Any, f: FaultSpec, end_t: float) -> CheckItem:
    label = f"pump trip at t = {f.at_s:g} s (pump {f.pump}): alarm and standby takeover"
    if f.at_s > end_t:
        return CheckItem(label, False, f"the run ended at t = {end_t:.0f} s, before the trip")
    before = [p for p in rec.pumps if p["t_s"] <= f.at_s]
    if not before:
        return CheckItem(label, False, "no valvey state/pumps before the trip")
    duty0 = before[-1]["duty"]
    alarm = _raised(rec, lambda k: k == "valvey:pump_failover", f.at_s, f.at_s + ATTRIBUTION_S)
    others = [k for t, k, kind in rec.alarm_log if kind == "raised" and k.startswith(
        "valvey:pump_") and k != "valvey:pump_failover" and f.at_s <= t <= f.at_s + ATTRIBUTION_S]
    also = f" (with {', '.join(others)})" if others else ""
    take = next((p for p in rec.pumps if p["t_s"] > f.at_s and p["duty"] != duty0
                 and (p["running"].get(str(p["duty"])) or 0) > 0.5), None)
    seen_alarm = (f"alarm {alarm[1]} raised at {_fmt_t(alarm[0])} "
                  f"({alarm[0] - f.at_s:+.1f} s){also}") if alarm else (
        f"no valvey:pump_failover raised (pump alarms: {', '.join(others) or 'none'})")
    if take is None:
        last = rec.pumps[-1]
        seen = (f"{seen_alarm}; duty pump still {last['duty']} (was {duty0}), running "
                f"{last['running']} at {_fmt_t(last['t_s'])}")
        return CheckItem(label, False, seen)
    took = (f"duty pump {duty0} -> {take['duty']}, running at {_fmt_t(take['t_s'])} "
            f"(takeover {take['t_s'] - f.at_s:.1f} s after the trip, as valvey's state/pumps "
            "showed it)")
    return CheckItem(label, alarm is not None, f"{seen_alarm}; {took}")


def _flap_items(rec: Any, f: FaultSpec, end_t: float) -> list[CheckItem]:
    thing = alarm_id("link_flapping", str(f.port))
    label = f"link flap on {f.port} from t = {f.at_s:g} s detected"
    if f.at_s > end_t:
        why = f"the run ended at t = {end_t:.0f} s, before the flap"
        return [CheckItem(label, False, why),
                CheckItem("rack held out of production until re-validated", False, why)]
    last_down = f.at_s + (f.count - 1) * (f.down_s or 0.0) + (f.count - 1) * (f.up_s or 0.0)
    hit = _raised(rec, lambda k: k == f"racky:{thing}", f.at_s, fault_end_s(f) + ATTRIBUTION_S)
    if hit is None:
        other = [k for t, k, kind in rec.alarm_log if kind == "raised" and t >= f.at_s
                 and k.endswith(thing.split(":", 1)[1])]
        seen = (f"no racky:{thing} (alarms on the port: {', '.join(other) or 'none'}; run "
                f"ended at t = {end_t:.0f} s)")
        detect = CheckItem(label, False, seen)
    else:
        detect = CheckItem(label, True, f"alarm {hit[1]} raised at {_fmt_t(hit[0])}: "
                                        f"{hit[0] - f.at_s:.1f} s after the flap began, "
                                        f"{hit[0] - last_down:.1f} s after its last down "
                                        f"({f.count} downs of {f.down_s:g} s)")
    return [detect, _held_item(rec, f, hit)]


def _held_item(rec: Any, f: FaultSpec, hit: tuple[float, str] | None) -> CheckItem:
    label = "rack held out of production until re-validated"
    log = rec.lifecycle_log
    if not log:
        return CheckItem(label, False, "racky published no lifecycle")
    at_flap = [r for r in log if r[0] <= f.at_s]
    start = at_flap[-1] if at_flap else log[0]
    end = log[-1]
    q = next((r for r in log if r[0] >= f.at_s and r[1] == "quarantined"), None)
    end_txt = (f"lifecycle at the end: {end[1]}, "
               f"{'validated' if end[4] else 'no passed validation'}")
    if start[1] != "production":
        return CheckItem(label, False, f"the rack was in {start[1]}, not production, when the "
                                       f"flap began; {end_txt}")
    if q is None:
        return CheckItem(label, False, f"racky never quarantined the rack; {end_txt}")
    after_alarm = hit is not None and q[0] >= hit[0] - 1.0  # state/rack and alarm: same tick
    ok = after_alarm and end[1] != "production" and not end[4]
    return CheckItem(label, ok, f"production -> quarantined at {_fmt_t(q[0])} by {q[2]} "
                                f"({q[3]}); {end_txt}")


def _target_matches(f: FaultSpec, key: str) -> bool:
    daemon, _, aid = key.partition(":")
    if f.kind == "pump_trip":
        return daemon == "valvey" and (aid in PUMP_ALARMS or aid.startswith("pump_"))
    if f.port is not None:
        return aid.endswith(alarm_id("x", str(f.port))[1:])  # ":<port>"
    return False


def _unexpected_item(rec: Any, sc: Scenario,
                     explained: Mapping[str, tuple[str, str]]) -> CheckItem:
    label = "no unexpected alarms"
    wins = fault_windows(sc)
    raised = [(t, k) for t, k, kind in rec.alarm_log if kind == "raised"]
    by_setup = [(t, k) for t, k in raised if k in explained
                and explained[k][0] in rec.alarm_messages.get(k, "")]
    odd = [(t, k) for t, k in raised if (t, k) not in by_setup
           and not any(a <= t <= b + ATTRIBUTION_S and _target_matches(f, k) for a, b, f in wins)]
    if odd:
        return CheckItem(label, False, "raised without a scripted fault to explain it: " +
                         ", ".join(f"{k} at {_fmt_t(t)}" for t, k in odd))
    why = sorted({f"{k}: {explained[k][1]}" for _, k in by_setup})
    return CheckItem(label, True, f"{len(raised)} alarm(s) raised, each by a scripted fault"
                     + (f" or the run's setup ({'; '.join(why)})" if why else ""))


def checklist(sc: Scenario, rec: Any, steps: Sequence[dict[str, Any]], end_t: float, *,
              bursts: Mapping[str, Any] | None = None,
              explained: Mapping[str, tuple[str, str]] | None = None) -> list[CheckItem]:
    """The checklist of a run (see the module docstring); ``rec`` is the run's
    `harness.demo.record.Recorder`, ``steps`` `harness.demo.summary.summarise`'s rows,
    ``end_t`` the last plant time seen, s; ``bursts`` `harness.demo.bursts.burst_figures`'
    dict (its item is there whenever ``sc``'s load is agentic bursts: unchecked without
    figures); ``explained``: alarm key (``racky:power_capped``) -> (a text its message must
    contain, why it is expected)."""
    items = _step_items(steps)
    if is_burst_load(sc):
        items.append(_burst_item(bursts, end_t))
    for f in sc.faults:
        if f.kind == "pump_trip":
            items.append(_pump_trip_item(rec, f, end_t))
        elif f.kind == "link_flap":
            items += _flap_items(rec, f, end_t)
    items.append(_unexpected_item(rec, sc, explained or {}))
    return items
