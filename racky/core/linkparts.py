"""Shared parts of a rack's links: errors rising together on the ports of one part (a switch
tray, a GPU's NIC, a cable) are one finding naming the part (pure; issue 22).

Parts (`part_members`): every NVLink port index j of every GPU lands on switch tray
``j // nvlink_ports_per_switch_tray`` (NVL72: 18 NVLink ports per GPU over 9 switch trays,
2 each); the NIC ports of one GPU share its NIC (``gpuNN/nic``); operators add parts by
name with port-name patterns (``[links] parts``: cables, cartridges; `fnmatch` patterns).

`PartGrouper` keeps one `racky.core.linkrate.LearnedRateCusum` per part over the pooled
pre-FEC counts of its ports (the sum over the ports known in the bin, scaled up to all of
them when at least 80 % are known, else unknown): a small rise on many ports of a part shows in
the pooled counts long before any one port's statistic moves. Each bin it decides:

* a part is a **finding** when its pooled statistic is in alarm and not exactly one of its
  ports is hot (in alarm or on watch), or when two or more of its ports are in alarm, or
  one is in alarm and the pooled statistic holds more evidence than that port's own (the
  other ports add to it; one bad port among healthy ones lowers it); it
  stays one while its pooled alarm lasts (ports rising together race: the first one hot
  does not make it that port's fault);
* the port alarms of a part with a finding are folded into it (one finding, listing them);
* a pooled alarm with exactly one hot port is that port's fault: the port alarm stands alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase

import numpy as np
import numpy.typing as npt

from racky.core.linkrate import LearnedRateCusum, RateDesign

__all__ = ["PartGrouper", "part_members"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

KNOWN_FRACTION = 0.8


def part_members(names: Sequence[str], is_nvlink: BoolArray, ports_per_gpu: int,
                 nvlink_ports_per_switch_tray: int,
                 extra: Mapping[str, Sequence[str]] | None = None) -> dict[str, list[int]]:
    """Part name -> port indices (GPU-major layout; see the module docstring). Parts with
    fewer than two ports are left out (a one-port part is the port)."""
    out: dict[str, list[int]] = {}
    n = len(names)
    nvl_rank = np.zeros(n, dtype=np.int64)
    for g0 in range(0, n, ports_per_gpu):
        k = 0
        for p in range(g0, min(g0 + ports_per_gpu, n)):
            if is_nvlink[p]:
                nvl_rank[p] = k
                k += 1
    for p in range(n):
        if is_nvlink[p] and nvlink_ports_per_switch_tray > 0:
            out.setdefault(f"switchtray{nvl_rank[p] // nvlink_ports_per_switch_tray:02d}",
                           []).append(p)
        elif not is_nvlink[p]:
            out.setdefault(f"gpu{p // ports_per_gpu:02d}/nic", []).append(p)
    for part, patterns in (extra or {}).items():
        out[part] = [p for p in range(n) if any(fnmatchcase(names[p], pat) for pat in patterns)]
    return {k: v for k, v in out.items() if len(v) >= 2}


class PartGrouper:
    """Pooled per-part detectors and the grouping rule (see the module docstring).

    Args:
        members: part name -> port indices (`part_members`).
        n_ports: ports of the rack.
        design: the per-port `RateDesign`; the pooled design is the same with its floor and
            cap scaled by the part's port count (the learnt baseline is the part's own).
    """

    def __init__(self, members: Mapping[str, Sequence[int]], n_ports: int,
                 design: RateDesign) -> None:
        self.parts = list(members)
        m = len(self.parts)
        self.member = np.zeros((m, n_ports), dtype=bool)
        for i, part in enumerate(self.parts):
            self.member[i, list(members[part])] = True
        self.size = self.member.sum(axis=1).astype(np.float64)
        big = float(self.size.max()) if m else 1.0
        pooled = RateDesign(
            ratio=design.ratio, h=design.h, h_clear=design.h_clear,
            dispersion=design.dispersion, warmup_bins=design.warmup_bins,
            min_bins=design.min_bins, tau_bins=design.tau_bins, z_margin=design.z_margin,
            floor=design.floor, cap=design.cap * big, initial=design.initial * big,
            refresh_bins=design.refresh_bins, learn_dispersion=design.learn_dispersion,
            dispersion_min=design.dispersion_min, alternative=design.alternative,
            arl0_bins=design.arl0_bins, h_min=design.h_min, h_max=design.h_max)
        self.det = LearnedRateCusum(m, pooled)
        self._mf = self.member.astype(np.float64)
        self._finding = np.zeros(m, dtype=bool)  # parts with a finding in the last bin

    def update_bin(self, counts: FloatArray, lower_bound: BoolArray) -> None:
        """Pool one closed bin (per port, NaN unknown) into the part detectors."""
        if not self.parts:
            return
        known = ~np.isnan(counts)
        k = self._mf @ known.astype(np.float64)
        s = self._mf @ np.where(known, counts, 0.0)
        enough = k >= KNOWN_FRACTION * self.size
        pooled = np.where(enough, s * self.size / np.maximum(k, 1.0), np.nan)
        lb = (self._mf @ (known & lower_bound).astype(np.float64)) > 0
        self.det.update(pooled, lower_bound=lb)

    def findings(self, port_alarm: BoolArray, port_watch: BoolArray,
                 port_s: FloatArray | None = None, port_h: FloatArray | None = None
                 ) -> tuple[dict[str, list[int]], BoolArray]:
        """(part -> its hot ports, for every part with a finding; the ports whose alarms are
        folded into a finding). ``port_s``, ``port_h``: the ports' statistics and thresholds
        (LLR units, (ports,)), when given a port alarm whose part's pooled statistic holds
        more evidence than the port's own is the part's (the other ports add to it: they are
        rising too). Evidence is a statistic over its own threshold: each detector's
        threshold holds the same false-alarm rate, and a statistic held at its cap (2h)
        is not more evidence for a higher h (one bad port: port and pool both at their
        caps, the alarm the port's).

        Raises:
            ValueError: ``port_s`` without ``port_h``."""
        n = port_alarm.shape[0]
        if not self.parts:
            return {}, np.zeros(n, dtype=bool)
        hot = port_alarm | port_watch
        n_hot = self.member @ hot.astype(np.int64)
        n_alarm = self.member @ port_alarm.astype(np.int64)
        on = self.det.state
        # a part stays a finding while its pooled alarm lasts: one of its ports getting hot
        # first (a race between ports rising together) does not turn it into a port's fault
        find = (on & ((n_hot != 1) | self._finding)) | (n_alarm >= 2)
        if port_s is not None:
            if port_h is None:
                raise ValueError("port_s needs port_h")
            rel = port_s / port_h
            s_alarmed = np.where(self.member & port_alarm[None, :], rel[None, :], -np.inf)
            find |= (n_alarm >= 1) & (self.det.s / self.det.h > s_alarmed.max(axis=1))
        self._finding = find & on
        folded = (self.member[find] & port_alarm[None, :]).any(axis=0)
        out = {self.parts[i]: [int(p) for p in np.flatnonzero(self.member[i] & hot)]
               for i in np.flatnonzero(find)}
        return out, folded
