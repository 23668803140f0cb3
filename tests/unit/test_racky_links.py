"""racky.core.links.LinkHealth on small frames: FIELD-CASES BR-11 and BR-13 through racky's whole
per-port pipeline (counter deltas → events → window rule → alarm condition)."""

from __future__ import annotations

import numpy as np

from racky.config import RackyConfig
from racky.core.linkframe import LinkFrame
from racky.core.links import LinkHealth
from racky.link_settings import LinkSettings

# BR-13 (c): polls every 10 s, 4 transitions in 60 s, quiet 300 s.
BR13 = {"flap_events": "transitions", "flap_count": 4, "flap_window_s": 60.0,
        "flap_quiet_s": 300.0, "flap_score": False}


class Port:
    """One GPU with two NIC ports, polled by hand."""

    def __init__(self, **links: object) -> None:
        base = RackyConfig()
        self.cfg = LinkSettings.model_validate({**base.links.model_dump(), **links})
        self.frame = LinkFrame.empty(list(self.cfg.counters), 1, 2)
        f = self.frame
        f.names[:] = ["gpu00/nic0", "gpu00/nic1"]
        f.link_up[:] = True
        f.counter_seen[:] = True
        f.speed_mb_per_s[:] = 50_000.0
        f.uptime_s[:] = 1000.0
        f.boot_id[:] = 7
        self.lh = LinkHealth(self.cfg, base.traffic, f)
        self.t0 = 0.0

    def poll(self, t: float, *, up: bool = True, carrier: int | None = None,
             uptime: float | None = None, boot: int | None = None) -> set[str]:
        f = self.frame
        f.t_mono[:] = t
        f.link_up[0] = up
        if carrier is not None:
            f.counter("carrier_changes")[0] = np.uint64(carrier)
        f.uptime_s[:] = 1000.0 + t if uptime is None else uptime
        if boot is not None:
            f.boot_id[:] = boot
        st = self.lh.step(t, f)
        return {k for k, v in st.conditions.items() if "gpu00/nic0" in v}


def test_br13_a_polled_state_one_alert_at_the_fourth_transition_cleared_after_quiet() -> None:
    """BR-13 a: up, down, up, ... every 10 s (12 transitions in 2 min): racky's flap condition
    rises at the 4th transition (t = 40 s), stays one incident, clears 300 s after the last
    transition; the other port of the GPU is untouched."""
    p = Port(**BR13)
    on: list[float] = []
    off: list[float] = []
    was = False
    carrier = 0
    prev = True
    for i in range(13 + 50):
        t = i * 10.0
        up = (i % 2 == 0) if i < 13 else True
        carrier += int(up != prev)
        prev = up
        now = "link_flapping" in p.poll(t, up=up, carrier=carrier)
        if now and not was:
            on.append(t)
        if was and not now:
            off.append(t)
        was = now
    assert on == [40.0]
    assert off == [120.0 + 300.0]


def test_br13_b_carrier_change_delta_with_both_polls_up_raises_the_flap() -> None:
    """BR-13 b: both polls read up; carrier_changes 14 → 20 (3 down/up cycles between polls):
    the 6 transitions are counted from the delta and the flap alert is raised."""
    p = Port(**BR13)
    assert "link_flapping" not in p.poll(0.0, carrier=14)
    assert "link_flapping" in p.poll(10.0, carrier=20)


def test_br11_carrier_changes_wrap_counts_and_a_reboot_is_no_flap() -> None:
    """BR-11 through racky: the 32-bit carrier_changes wrapping (2^32 − 3 → 3, uptime rising)
    is 6 transitions (a flap); the same decrease with uptime falling (a reboot) is a reset:
    no events, no flap, no error alarm, never a negative rate."""
    p = Port(**BR13)
    p.poll(0.0, carrier=2**32 - 3)
    assert "link_flapping" in p.poll(10.0, carrier=3)
    q = Port(**BR13)
    q.poll(0.0, carrier=2**32 - 3, uptime=5000.0)
    got = q.poll(10.0, carrier=3, uptime=4.0, boot=8)
    assert not got & {"link_flapping", "link_errors", "link_error_rate"}
    assert q.lh.events_total[0] == 0


def test_nvsentinel_default_three_link_downs_in_ten_minutes() -> None:
    """racky's default rule (REFERENCE §5 S7): 3 link-downs within 10 min declare flapping at
    the poll that reveals the 3rd; 2 do not."""
    p = Port()
    downs = 0
    raised_at = None
    for t in range(0, 600, 1):
        up = t not in (60, 220, 380)
        if not up:
            downs += 1
        got = p.poll(float(t), up=up)
        if "link_flapping" in got and raised_at is None:
            raised_at = t
    assert raised_at == 380


def test_a_cleared_64_bit_counter_is_a_reset_not_a_wrap_and_raises_nothing() -> None:
    """A 64-bit NVLink counter cleared by software (1000 → 0) with the GPU's uptime and boot id
    unchanged: taken as a wrap it would be a rise of 2^64 − 1000 errors (a DCGM "any rise"
    failure and a CUSUM alarm from one bin). A 64-bit counter cannot wrap at any plausible
    rate, so the decrease is a reset: no delta, no alarm (BR-11: a decrease is a wrap only
    when the wrapped delta is plausible)."""
    p = Port()
    for name in ("nvl_replay_errors", "nvl_crc_flit_errors"):
        p.frame.counter(name)[0] = np.uint64(1000)
    raised: set[str] = set()
    for i in range(400):
        if i == 10:
            for name in ("nvl_replay_errors", "nvl_crc_flit_errors"):
                p.frame.counter(name)[0] = np.uint64(0)
        raised |= p.poll(float(i))
    assert raised == set()
    assert p.cfg.counter_spec("nvl_replay_errors")[2] < 2.0**63


def test_a_bad_counter_rate_bound_is_a_config_error_not_a_crash_at_the_first_tick() -> None:
    """counter_max_rate_per_s = -1 (or NaN) used to load and then stop LinkHealth at its
    first tick (CounterDeltas refuses it); a name not in links.counters was silently unused."""
    import pytest
    from pydantic import ValidationError

    base = RackyConfig().links.model_dump()
    for rates, why in (({"carrier_changes": -1.0}, "must be > 0"),
                       ({"carrier_changes": float("nan")}, "must be > 0"),
                       ({"carier_changes": 10.0}, "not in links.counters")):
        with pytest.raises(ValidationError, match=why):
            LinkSettings.model_validate({**base, "counter_max_rate_per_s": rates})
    ok = LinkSettings.model_validate({**base, "counter_max_rate_per_s": {
        "carrier_changes": float("inf")}})
    assert ok.counter_spec("carrier_changes")[2] == float("inf")


def _drop_time(p: Port, read_every_s: int, reads_until_s: float = 1e9) -> float | None:
    f = p.frame
    for i in range(400):
        t = float(i)
        if i % read_every_s == 0 and t <= reads_until_s:
            f.t_mono[:] = t
            f.link_up[0] = i < 10
            f.uptime_s[:] = 1000.0 + t
        st = p.lh.step(t, f)
        if "gpu00/nic0" in st.conditions["port_dropped"]:
            return t
    return None


def test_port_dropped_with_telemetry_slower_than_the_tick_and_never_on_stale_reads() -> None:
    """Reads every 2 s, ticks every 1 s: a tick without a new read used to restart the
    240 s on-delay (NaN = no information), so a port held down was never declared dropped.
    The last read holds while it is younger than stale_after_s. A tray that goes silent with
    its port down is not declared dropped on its stale last read (tray_stale covers it)."""
    t = _drop_time(Port(), read_every_s=2)
    assert t is not None and 250.0 <= t <= 252.0
    assert _drop_time(Port(), read_every_s=1) == 250.0
    assert _drop_time(Port(), read_every_s=2, reads_until_s=100.0) is None
