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
