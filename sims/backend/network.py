"""`BackendNetwork`: the leaf/spine fabric between racks and the rate each backend flow gets
(max-min fair, work-conserving), vectorised over flows (pure numpy, no Python loop over ports).

Topology (rail-optimised, `BackendParams`): backend port ``g`` of a rack (tray ``t``, rail
``k``, ``g = t·K + k`` with K rails = 4 GPUs × NIC ports per GPU) is cabled to the rail-k leaf
of its rack group (``racks_per_leaf`` racks, pod ``r // racks_per_leaf``); every leaf has one
uplink bundle to each of ``spines`` spines, sized ``down capacity / (spines ×
oversubscription)`` at line rate. Traffic between two racks of one pod stays in the leaf;
between pods it goes up to the spines, split evenly over them (static ECMP), and down to the
other pod's leaf.

Traffic (the collective while NVLink is disabled): every backend port exchanges with its rail
peers (same tray slot, same rail) in every other rack, an all-to-all among the racks per
(tray, rail): port ``(r, g)`` offers ``offered[r, g] / (N − 1)`` to each peer. Rates are the
max-min fair allocation under the port capacities (send and receive), the leaf↔spine bundles
(each direction) and each flow's offered rate. Max-min is what congestion control converges
to on a saturating bandwidth test, and it is work-conserving: when one rack's ports are slow
(both directions), its peers send to each other what it cannot take, so they stay at their
own capacity (with N ≥ 3 racks; with 2 the peer has no one else to talk to). A synchronised
ring all-reduce would instead pace every rack at the slowest one; that is not modelled.

Algorithm: parallel water-filling. Each round every resource's fair share is its headroom /
its active flows; a flow's share is the least over its resources and its unmet demand; a
resource whose share is the least of all its active flows' shares is a bottleneck, and its
flows are fixed at that share (several bottlenecks at once: exact, as shares only rise). A
flow whose unmet demand is its least share is fixed at its demand. Rounds: at most the number
of resources; in practice a few (tests check against a per-flow reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Allocation", "BackendNetwork"]

F64 = npt.NDArray[np.float64]
_EPS = 1e-9
_U64 = np.uint64


@dataclass(frozen=True)
class Allocation:
    """One allocation, bytes/s. ``tx``, ``rx``: per rack and backend port, shape (racks,
    ports). ``up``, ``down``: per leaf↔spine bundle and direction carried in total over the
    spines, shape (pods, rails) (each spine carries 1/spines of it). ``flows``: per (tray,
    rail, sender, receiver), shape (trays, rails, racks, racks). ``rounds``: water-filling
    rounds used."""

    tx: F64
    rx: F64
    up: F64
    down: F64
    flows: F64
    rounds: int


class BackendNetwork:
    """The leaf/spine network of ``racks`` racks with ``trays`` trays and ``rails`` backend
    ports per tray (module docstring).

    Args:
        racks: racks (2..8).
        trays: trays per rack (18 on an NVL72).
        rails: backend ports per tray (4 GPUs × NIC ports per GPU).
        speed_bytes_per_s: nominal port line speed per direction, bytes/s.
        spines, racks_per_leaf, oversubscription: as `BackendParams`.

    Raises:
        ValueError: a count out of range.
    """

    def __init__(self, racks: int, trays: int, rails: int, speed_bytes_per_s: float, *,
                 spines: int = 4, racks_per_leaf: int = 1, oversubscription: float = 1.0,
                 ) -> None:
        for name, v, lo, hi in (("racks", racks, 2, 8), ("trays", trays, 1, 64),
                                ("rails", rails, 1, 64), ("spines", spines, 1, 64),
                                ("racks_per_leaf", racks_per_leaf, 1, 8)):
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"{name} must be an integer in {lo}..{hi} (got {v!r})")
        if not (speed_bytes_per_s > 0.0 and np.isfinite(speed_bytes_per_s)):
            raise ValueError("speed_bytes_per_s must be finite and > 0")
        if not (1.0 <= oversubscription <= 8.0):
            raise ValueError("oversubscription must be within 1..8")
        self.racks, self.trays, self.rails, self.spines = racks, trays, rails, spines
        self.ports = trays * rails
        self.pod_of_rack = np.arange(racks) // racks_per_leaf
        self.pods = int(self.pod_of_rack[-1]) + 1
        self._pod_start = np.flatnonzero(np.r_[True, np.diff(self.pod_of_rack) > 0])
        racks_in_pod = np.bincount(self.pod_of_rack, minlength=self.pods).astype(float)
        #: Line capacity of one leaf↔spine bundle, per direction, bytes/s: shape (pods, rails).
        self.bundle_capacity = np.repeat(
            (racks_in_pod * trays * speed_bytes_per_s / (spines * oversubscription))[:, None],
            rails, axis=1)
        #: Share of each (pod, rail, spine) bundle left to the backend, both directions; the
        #: rest carries other traffic (a congested spine uplink: `MultiRack.congest_spine`).
        self.bundle_factor = np.ones((self.pods, rails, spines))
        self._cross = self.pod_of_rack[:, None] != self.pod_of_rack[None, :]
        self._offdiag = ~np.eye(racks, dtype=bool)
        self._byte_carry = np.zeros((2, self.pods, rails, spines))
        #: tx bytes counters per (direction up/down, pod, rail, spine): uint64, wrap at 2^64.
        self.tx_bytes = np.zeros((2, self.pods, rails, spines), dtype=np.uint64)
        self.last: Allocation | None = None

    def bundle_names(self) -> list[str]:
        """``leaf-p0-r3/spine1`` per (pod, rail, spine), in C order of the bundle arrays."""
        return [f"leaf-p{p}-r{k}/spine{s}" for p in range(self.pods)
                for k in range(self.rails) for s in range(self.spines)]

    def allocate(self, offered: npt.ArrayLike, capacity: npt.ArrayLike,
                 bundle_factor: npt.ArrayLike | None = None) -> Allocation:
        """Max-min fair rates for ``offered`` (bytes/s each port wants to send, shape (racks,
        ports)) under port ``capacity`` (bytes/s each port can send and receive, shape
        (racks, ports); 0: link down) and ``bundle_factor`` (shape (pods, rails, spines);
        default the network's `bundle_factor`). Pure: changes nothing.

        Raises:
            ValueError: a wrong shape, a negative or non-finite value.
        """
        n, T, K = self.racks, self.trays, self.rails
        off = np.asarray(offered, dtype=np.float64)
        cap = np.asarray(capacity, dtype=np.float64)
        bf = self.bundle_factor if bundle_factor is None else np.asarray(bundle_factor, float)
        for name, a, shape in (("offered", off, (n, self.ports)),
                               ("capacity", cap, (n, self.ports)),
                               ("bundle_factor", bf, (self.pods, K, self.spines))):
            if a.shape != shape:
                raise ValueError(f"{name} must have shape {shape} (got {a.shape})")
            if not (np.isfinite(a).all() and (a >= 0.0).all()):
                raise ValueError(f"{name} values must be finite and >= 0")
        # (T, K, N): port g = t*K + k
        c_port = cap.reshape(n, T, K).transpose(1, 2, 0)
        want = off.reshape(n, T, K).transpose(1, 2, 0)
        c_tx = np.minimum(c_port, want)  # a port sends what it offers, up to its capacity
        # a leaf↔spine bundle limits its flows to spines × its least spine share (static ECMP)
        c_bundle = (self.bundle_capacity * self.spines * bf.min(axis=2)).T  # (K, pods)
        x = np.zeros((T, K, n, n))  # (T, K, N_from, N_to)
        active = self._offdiag & (c_tx > 0.0)[..., :, None] & (c_port > 0.0)[..., None, :]
        cross = self._cross
        pod = self.pod_of_rack
        inf = np.inf
        rounds = 0
        while active.any():
            rounds += 1
            if rounds > 4 * (2 * n * T * K + 2 * self.pods * K) + 8:
                raise RuntimeError("water-filling did not converge")  # pragma: no cover
            a = active.astype(np.float64)
            ac = a * cross
            xc = x * cross
            with np.errstate(divide="ignore", invalid="ignore"):
                s_tx = np.where(a.sum(3) > 0, (c_tx - x.sum(3)) / a.sum(3), inf)
                s_rx = np.where(a.sum(2) > 0, (c_port - x.sum(2)) / a.sum(2), inf)
                n_up = np.add.reduceat(ac.sum(axis=(0, 3)), self._pod_start, axis=1)
                n_dn = np.add.reduceat(ac.sum(axis=(0, 2)), self._pod_start, axis=1)
                l_up = np.add.reduceat(xc.sum(axis=(0, 3)), self._pod_start, axis=1)
                l_dn = np.add.reduceat(xc.sum(axis=(0, 2)), self._pod_start, axis=1)
                s_up = np.where(n_up > 0, (c_bundle - l_up) / n_up, inf)  # (K, pods)
                s_dn = np.where(n_dn > 0, (c_bundle - l_dn) / n_dn, inf)
            np.maximum(s_tx, 0.0, out=s_tx)
            np.maximum(s_rx, 0.0, out=s_rx)
            f_tx = s_tx[..., :, None]
            f_rx = s_rx[..., None, :]
            f_up = np.where(cross, np.maximum(s_up, 0.0)[None, :, pod, None], inf)
            f_dn = np.where(cross, np.maximum(s_dn, 0.0)[None, :, None, pod], inf)
            m = np.minimum(np.minimum(f_tx, f_rx), np.minimum(f_up, f_dn))
            share = np.where(active, m, inf)
            tol = _EPS * (1.0 + share)
            # a resource is a bottleneck when its share is the least of its flows' shares
            b_tx = s_tx <= share.min(axis=3) + _EPS * (1.0 + s_tx)
            b_rx = s_rx <= share.min(axis=2) + _EPS * (1.0 + s_rx)
            sc = np.where(cross, share, inf)
            b_up = s_up <= np.minimum.reduceat(sc.min(axis=(0, 3)), self._pod_start, axis=1) \
                + _EPS * (1.0 + s_up)
            b_dn = s_dn <= np.minimum.reduceat(sc.min(axis=(0, 2)), self._pod_start, axis=1) \
                + _EPS * (1.0 + s_dn)
            fixed = active & (
                (b_tx[..., :, None] & (f_tx <= share + tol))
                | (b_rx[..., None, :] & (f_rx <= share + tol))
                | (cross & b_up[None, :, pod, None] & (f_up <= share + tol))
                | (cross & b_dn[None, :, None, pod] & (f_dn <= share + tol))
            )
            x = np.where(fixed, x + share, x)
            active &= ~fixed
        tx = x.sum(3).transpose(2, 0, 1).reshape(n, -1)
        rx = x.sum(2).transpose(2, 0, 1).reshape(n, -1)
        xc = x * cross
        up = np.add.reduceat(xc.sum(axis=(0, 3)), self._pod_start, axis=1).T
        dn = np.add.reduceat(xc.sum(axis=(0, 2)), self._pod_start, axis=1).T
        return Allocation(tx, rx, up, dn, x, rounds)

    def carry(self, alloc: Allocation, dt_s: float) -> None:
        """Count ``dt_s`` s of ``alloc`` on the bundles' byte counters (uint64, wrap at
        2^64; each spine carries 1/spines of a bundle's traffic) and keep it as `last`."""
        moved = self._carried(alloc) * dt_s + self._byte_carry
        whole = np.floor(moved)
        self._byte_carry = moved - whole
        self.tx_bytes = self.tx_bytes + whole.astype(np.uint64)  # uint64 adds wrap at 2^64
        self.last = alloc

    def bundle_readings(self) -> dict[str, Any]:
        """The leaf↔spine bundles as a switch would report them, arrays of shape (2, pods,
        rails, spines) (direction 0: leaf → spine, 1: spine → leaf): ``capacity_bytes_per_s``
        (left to the backend now), ``bytes_per_s`` (the last allocation's backend traffic plus
        the other traffic of a congested bundle), ``utilisation`` (of the line capacity, 0..1),
        ``tx_bytes`` (uint64 counter, wraps at 2^64); ``names`` (C order of the last 3 axes)."""
        line = self._line()
        carried = self._carried(self.last)
        return {"names": self.bundle_names(),
                "capacity_bytes_per_s": line * self.bundle_factor[None],
                "bytes_per_s": carried, "utilisation": carried / line,
                "tx_bytes": self.tx_bytes.copy()}

    def _line(self) -> F64:
        return np.broadcast_to(self.bundle_capacity[None, :, :, None], self.tx_bytes.shape)

    def _carried(self, alloc: Allocation | None) -> F64:
        """Bytes/s per (direction, pod, rail, spine): the backend's share plus the other
        traffic a congested bundle carries, line × (1 − factor)."""
        line = self._line()
        other = line * (1.0 - self.bundle_factor[None])
        if alloc is None:
            return np.array(other)
        ours = np.stack([alloc.up, alloc.down])[..., None] / self.spines
        return np.broadcast_to(ours, line.shape) + other
