"""valvey's core: heartbeat, shadow, and reconciling writes with the read-back."""

from __future__ import annotations

from rackplane.core.samples import Sample, good
from valvey.config import CduPoints, ControlSettings
from valvey.core.controller import ValveyCore
from valvey.core.supply_loop_settings import SupplyLoopSettings

T0 = 1000.0


def samples(t: float, supply_c: float, valve_cmd_pct: float) -> dict[str, Sample]:
    return {
        "supply_temp_c": good("supply_temp_c", supply_c, "degC", 0, t),
        "valve_command_pct": good("valve_command_pct", valve_cmd_pct, "%", 0, t),
    }


def core(**loop: object) -> ValveyCore:
    return ValveyCore(SupplyLoopSettings(**loop), CduPoints(), ControlSettings(), T0)


def test_heartbeat_every_interval_and_never_in_shadow() -> None:
    c = core()
    beats = []
    for k in range(50):  # 5 s at 10 Hz
        t = T0 + k * 0.1
        out = c.step(t, samples(t, 45.0, 60.0))
        beats += [v for p, v in out.writes if p == "heartbeat"]
    assert beats == [1.0, 2.0, 3.0, 4.0, 5.0]
    s = core(shadow=True)
    writes = []
    for k in range(50):
        t = T0 + k * 0.1
        writes += s.step(t, samples(t, 47.0, 60.0)).writes
    assert writes == []


def test_a_write_the_device_never_applied_is_written_again() -> None:
    """The read-back is the evidence a write landed (breaker finding C1's second half)."""
    c = core()
    t = T0
    c.step(t, samples(t, 45.0, 60.0))  # initialise from the read-back 60 %
    written = []
    for k in range(1, 200):  # 20 s; the PV is 47 °C, so the loop opens the valve...
        t = T0 + k * 0.1
        out = c.step(t, samples(t, 47.0, 60.0))  # ...but the device keeps reading 60 %
        written += [(round(t - T0, 1), v) for p, v in out.writes if p == "valve_command_pct"]
    assert written, "the loop should have written"
    assert c.state()["readback_mismatch"] is True
    # Re-asserted at most once per readback_confirm_s (3 s), never every tick: 20 s allows 6.
    assert 1 <= c.reasserts <= 20 / 3
    reassert_writes = [t for t, _ in written if abs(t - round(t)) > 1e-6]
    assert 1 <= len(reassert_writes) <= c.reasserts


def test_no_reassert_when_the_readback_follows() -> None:
    c = core()
    t = T0
    c.step(t, samples(t, 45.0, 60.0))
    valve = 60.0
    for k in range(1, 300):
        t = T0 + k * 0.1
        out = c.step(t, samples(t, 46.0, valve))
        for p, v in out.writes:
            if p == "valve_command_pct":
                valve = v  # the device applies each write
    assert c.reasserts == 0
    assert c.state()["readback_mismatch"] is False


def _standby_tick(c: ValveyCore, t: float, supply_c: float, valve_pct: float) -> None:
    """One tick of a pair's standby (valvey.app's tick): its core follows the demand the
    CDU holds (`ValveyCore.track_active_output`, as `_track_cdu` does), then steps; its
    writes are withheld (the active's valve, not its own)."""
    if valve_pct != c.loop.command_pct:
        c.track_active_output(valve_pct)
    c.step(t, samples(t, supply_c, valve_pct))


def test_a_takeover_continues_the_active_output_and_never_reasserts_a_standby_value() -> None:
    """Issue 15: the standby computed (and withheld) a valve write in a transient, then the
    active moved the valve on. After the takeover the new active's first valve write
    continues from where the active left the valve: never the value its core computed as a
    standby, re-asserted by the read-back reconciliation (86 → 82 % measured in the chaos
    run before the fix: a 0.15 K bump at steady load)."""
    c = core()
    t = T0
    for k in range(30):  # 3 s settled at 60 %
        t = T0 + k * 0.1
        _standby_tick(c, t, 45.0, 60.0)
    for k in range(30, 60):  # a transient: the standby's loop wants more (withheld)
        t = T0 + k * 0.1
        _standby_tick(c, t, 47.0, 60.0)
    for k in range(60, 160):  # the active moved the valve to 70 %, the supply settled
        t = T0 + k * 0.1
        _standby_tick(c, t, 45.0, 70.0)
    valve = 70.0
    written: list[tuple[float, float]] = []
    for k in range(160, 360):  # takeover: 10 s at the setpoint, then 1 K above
        t = T0 + k * 0.1
        supply = 45.0 if k < 260 else 46.0
        for p, v in c.step(t, samples(t, supply, valve)).writes:
            if p == "valve_command_pct":
                written.append((round(t - T0, 1), v))
                valve = v  # the CDU applies each write
    # at the setpoint (inside the dead band) nothing moves the valve; then the loop opens it
    # from 70 %, at most one rate-limited period and one minimum step at a time
    assert written, "the loop should have opened the valve 1 K above its setpoint"
    assert all(t_s >= 26.0 for t_s, _ in written), written
    first = written[0][1]
    assert 70.0 < first <= 70.0 + 1.6 + 1.0, written
    assert all(v >= 70.0 for _, v in written), written
    assert c.reasserts == 0
