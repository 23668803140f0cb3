"""Issue 22: errors rising together on the ports of one shared part are one finding naming the
part (racky.core.linkparts through LinkHealth); a single bad port stays a port alarm."""

from __future__ import annotations

import numpy as np

from racky.config import RackyConfig
from racky.core.linkframe import LinkFrame
from racky.core.linkparts import part_members
from racky.core.links import LinkHealth
from racky.link_settings import LinkSettings

GPUS, NVL = 4, 4  # 4 GPUs × (4 NVLink + 1 NIC port); 2 NVLink ports per switch tray


def test_parts_switch_trays_by_nvlink_index_nics_by_gpu_and_configured_patterns() -> None:
    names = [f"gpu{g:02d}/nvl{j}" if j < NVL else f"gpu{g:02d}/nic0"
             for g in range(GPUS) for j in range(NVL + 1)]
    nvl = np.array([j < NVL for _ in range(GPUS) for j in range(NVL + 1)])
    m = part_members(names, nvl, NVL + 1, 2, {"cable-a": ["gpu0[01]/nvl3"]})
    assert set(m) == {"switchtray00", "switchtray01", "cable-a"}  # 1-port NICs are ports
    assert [names[p] for p in m["switchtray01"]][:2] == ["gpu00/nvl2", "gpu00/nvl3"]
    assert len(m["switchtray00"]) == 2 * GPUS
    assert [names[p] for p in m["cable-a"]] == ["gpu00/nvl3", "gpu01/nvl3"]


class Rack:
    """Ports read every 60 s with Poisson pre-FEC errors at a per-port rate."""

    def __init__(self) -> None:
        base = RackyConfig()
        self.cfg = LinkSettings.model_validate({
            **base.links.model_dump(), "baseline_warmup_min": 600.0, "baseline_min_min": 120.0})
        f = self.frame = LinkFrame.empty(list(self.cfg.counters), GPUS, NVL + 1)
        f.names[:] = [f"gpu{g:02d}/nvl{j}" if j < NVL else f"gpu{g:02d}/nic0"
                      for g in range(GPUS) for j in range(NVL + 1)]
        f.is_nvlink[:] = [j < NVL for _ in range(GPUS) for j in range(NVL + 1)]
        f.link_up[:] = True
        f.counter_seen[:] = True
        f.speed_mb_per_s[:] = 50_000.0
        f.boot_id[:] = 7
        self.lh = LinkHealth(self.cfg, base.traffic, f, stale_after_s=120.0)
        self.rng = np.random.default_rng(7)
        self.t = 0.0
        self.raised: dict[str, set[str]] = {}

    def minutes(self, n: int, rate: np.ndarray) -> None:
        f = self.frame
        for _ in range(n):
            self.t += 60.0
            for name in (self.cfg.pre_fec_nvlink, self.cfg.pre_fec_nic):
                row = f.counter(name)
                row += self.rng.poisson(rate).astype(np.uint64)
            f.t_mono[:] = self.t
            f.uptime_s[:] = 1e5 + self.t
            st = self.lh.step(self.t, f)
            for kind in ("link_error_rate", "link_part_errors"):
                self.raised.setdefault(kind, set()).update(st.conditions[kind])


def test_a_rise_on_every_port_of_a_switch_tray_is_one_finding_naming_it() -> None:
    r = Rack()
    n = GPUS * (NVL + 1)
    healthy = np.full(n, 0.5)
    r.minutes(900, healthy)
    assert r.raised == {"link_error_rate": set(), "link_part_errors": set()}
    tray0 = np.array([j in (0, 1) for _ in range(GPUS) for j in range(NVL + 1)])
    r.minutes(300, np.where(tray0, 2.0, 0.5))
    assert r.raised["link_part_errors"] == {"switchtray00"}
    assert r.raised["link_error_rate"] == set()  # folded into the part's finding


def test_one_bad_port_is_a_port_alarm_not_its_switch_tray() -> None:
    r = Rack()
    n = GPUS * (NVL + 1)
    r.minutes(900, np.full(n, 0.5))
    bad = np.zeros(n, dtype=bool)
    bad[3] = True  # gpu00/nvl3
    r.minutes(300, np.where(bad, 5.0, 0.5))
    assert r.raised["link_error_rate"] == {"gpu00/nvl3"}
    assert r.raised["link_part_errors"] == set()


def test_a_link_faulty_from_its_first_minute_is_judged_by_the_configured_design_meanwhile(
        ) -> None:
    """A port ramping 0.5 → 10/min over 2 h from its first read (no history, no persisted
    baseline): the configured fixed design judges it until its own baseline is learnt, so it
    is found within the S8 fast-ramp bound, and it learns nothing while that statistic is off
    zero (the ramp does not become its baseline)."""
    r = Rack()
    n = GPUS * (NVL + 1)
    first = None
    for m in range(120):
        rate = np.full(n, 0.5)
        rate[3] = 0.5 + 9.5 * m / 120.0
        r.minutes(1, rate)
        if first is None and "gpu00/nvl3" in r.raised["link_error_rate"]:
            first = m + 1
    assert first is not None and first <= 35
    assert r.lh._learned.baseline[3] < 1.0
    assert r.raised["link_error_rate"] == {"gpu00/nvl3"}


def test_a_part_finding_stays_one_when_one_of_its_ports_gets_hot_first() -> None:
    """Ports rising together race: the pooled alarm of a part comes first (no port hot), then
    one of its ports alarms alone before the other is on watch. The part stays the finding
    and the port alarm is folded into it (it used to flip to a lone port alarm)."""
    from racky.core.linkparts import PartGrouper
    from racky.core.links import rate_design

    g = PartGrouper({"gpu05/nic": [0, 1]}, 2, rate_design(RackyConfig().links))
    g.det._active[:] = True  # the pooled statistic in alarm
    none = np.zeros(2, dtype=bool)
    parts, folded = g.findings(none, none)
    assert parts == {"gpu05/nic": []}
    one = np.array([True, False])
    parts, folded = g.findings(one, none)
    assert parts == {"gpu05/nic": [0]} and folded.tolist() == [True, False]
    g.det._active[:] = False  # the pooled alarm cleared: a lone port alarm is the port's
    g2 = PartGrouper({"gpu05/nic": [0, 1]}, 2, rate_design(RackyConfig().links))
    g2.det._active[:] = True
    parts, folded = g2.findings(one, none)
    assert parts == {} and not folded.any()


def test_a_port_alarm_is_its_parts_when_the_pooled_statistic_holds_more_evidence() -> None:
    """Two ports rising together: one alarms a bin before the pooled statistic does; the pool
    already holds more evidence than that port (the other port adds to it), so the alarm is
    the part's. One bad port among healthy ones: the pool holds less, the alarm stays the
    port's."""
    from racky.core.linkparts import PartGrouper
    from racky.core.links import rate_design

    none = np.zeros(2, dtype=bool)
    one = np.array([True, False])
    g = PartGrouper({"gpu05/nic": [0, 1]}, 2, rate_design(RackyConfig().links))
    g.det.s[:] = 19.0
    h = np.array([18.0, 18.0])  # the ports' thresholds (the pool's: 18 while unarmed)
    parts, folded = g.findings(one, none, np.array([18.5, 6.0]), h)
    assert parts == {"gpu05/nic": [0]} and folded.tolist() == [True, False]
    g2 = PartGrouper({"gpu05/nic": [0, 1]}, 2, rate_design(RackyConfig().links))
    g2.det.s[:] = 12.0
    parts, folded = g2.findings(one, none, np.array([18.5, 0.0]), h)
    assert parts == {} and not folded.any()


def test_a_port_and_its_pool_both_at_their_caps_is_the_ports_alarm() -> None:
    """Each statistic is held at twice its own threshold: a pool whose threshold is a little
    higher than the port's (its own learned rate's) holds no more evidence at its cap."""
    from racky.core.linkparts import PartGrouper
    from racky.core.links import rate_design

    none = np.zeros(2, dtype=bool)
    one = np.array([True, False])
    g = PartGrouper({"switchtray01": [0, 1]}, 2, rate_design(RackyConfig().links))
    g.det.h[:] = 18.50
    g.det.s[:] = 2 * 18.50
    parts, folded = g.findings(one, none, np.array([2 * 18.46, 1.0]), np.array([18.46, 18.5]))
    assert parts == {} and not folded.any()
