"""sims.backend.network: the max-min allocation against a plain per-flow reference, fault
localisation on the network alone, the bundle byte counters' wrap, bad inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sims.backend import BackendNetwork

SP = 50e9  # 400 Gb/s in bytes/s


def reference_max_min(net: BackendNetwork, offered: np.ndarray, cap: np.ndarray,
                      bf: np.ndarray) -> np.ndarray:
    """Textbook progressive filling, one flow at a time in Python: every unfrozen flow rises
    by the same amount until a resource fills; its flows freeze. Returns flows (T, K, N, N)."""
    n, T, K = net.racks, net.trays, net.rails
    pod = net.pod_of_rack
    flows = []
    for t, k, i, j in itertools.product(range(T), range(K), range(n), range(n)):
        if i != j:
            flows.append((t, k, i, j))
    res: dict[tuple, float] = {}
    use: dict[tuple, list[tuple]] = {}
    for f in flows:
        t, k, i, j = f
        g = t * K + k
        keys = [("tx", i, g), ("rx", j, g)]
        res[("tx", i, g)] = min(cap[i, g], offered[i, g])
        res[("rx", j, g)] = cap[j, g]
        if pod[i] != pod[j]:
            for key, p in ((("up", pod[i], k), pod[i]), (("dn", pod[j], k), pod[j])):
                res[key] = net.bundle_capacity[p, k] * net.spines * bf[p, k].min()
                keys.append(key)
        use[f] = keys
    rate = dict.fromkeys(flows, 0.0)
    active = {f for f in flows if all(res[key] > 0 for key in use[f])}
    for f in set(flows) - active:
        rate[f] = 0.0
    while active:
        load: dict[tuple, float] = dict.fromkeys(res, 0.0)
        cnt: dict[tuple, int] = dict.fromkeys(res, 0)
        for f in flows:
            for key in use[f]:
                load[key] += rate[f]
                if f in active:
                    cnt[key] += 1
        delta = min((res[key] - load[key]) / cnt[key] for key in res if cnt[key])
        for f in active:
            rate[f] += delta
        full = {key for key in res if cnt[key] and res[key] - load[key] - delta * cnt[key]
                <= 1e-9 * max(res[key], 1.0)}
        active = {f for f in active if not any(key in full for key in use[f])}
    x = np.zeros((T, K, n, n))
    for (t, k, i, j), v in rate.items():
        x[t, k, i, j] = v
    return x


@pytest.mark.parametrize("case", range(6))
def test_allocation_matches_the_reference(case: int) -> None:
    rng = np.random.default_rng(case)
    n = 3 + case % 3
    net = BackendNetwork(n, 2, 2, SP, spines=2, racks_per_leaf=1 + case % 2)
    offered = SP * rng.choice([0.0, 0.2, 0.6, 1.0], size=(n, 4))
    cap = SP * rng.uniform(0.3, 0.97, size=(n, 4))
    cap[rng.random((n, 4)) < 0.1] = 0.0  # a link down
    bf = np.ones((net.pods, 2, 2))
    bf[0, 1, 0] = rng.uniform(0.05, 0.5)
    a = net.allocate(offered, cap, bf)
    ref = reference_max_min(net, offered, cap, bf)
    assert np.allclose(a.flows, ref, rtol=1e-6, atol=1e3), (a.flows - ref)
    assert (a.tx <= np.minimum(offered, cap) * (1 + 1e-9) + 1).all()
    assert (a.rx <= cap * (1 + 1e-9) + 1).all()
    assert a.rounds >= 1


def _four(racks_per_leaf: int = 1) -> tuple[BackendNetwork, np.ndarray, np.ndarray]:
    net = BackendNetwork(4, 18, 8, SP, racks_per_leaf=racks_per_leaf)
    return net, np.full((4, 144), SP), np.full((4, 144), 0.95 * SP)


def test_a_slow_rack_slows_only_itself_with_three_or_more_racks() -> None:
    net, off, cap = _four()
    cap[2] = 0.6 * SP
    a = net.allocate(off, cap)
    assert np.allclose(a.tx[2], 0.6 * SP) and np.allclose(a.rx[2], 0.6 * SP)
    for r in (0, 1, 3):
        assert np.allclose(a.tx[r], 0.95 * SP) and np.allclose(a.rx[r], 0.95 * SP)


def test_two_racks_cannot_hide_a_slow_peer() -> None:
    """With two racks the healthy one has no one else to talk to (documented limit)."""
    net = BackendNetwork(2, 18, 8, SP)
    cap = np.full((2, 144), 0.95 * SP)
    cap[0] = 0.6 * SP
    a = net.allocate(np.full((2, 144), SP), cap)
    assert np.allclose(a.tx[1], 0.6 * SP)


def test_a_congested_spine_bundle_slows_its_leaf_rail_only() -> None:
    net, off, cap = _four()
    bf = np.ones((4, 8, 4))
    bf[1, 3, 2] = 0.2  # rack 1's rail-3 leaf to spine 2
    a = net.allocate(off, cap, bf)
    tx = a.tx.reshape(4, 18, 8)
    # static ECMP: every rail-3 flow of rack 1 crosses spine 2, so 4 × 0.2 of a spine share
    assert np.allclose(tx[1, :, 3], 0.2 * SP)
    others = np.ones((4, 18, 8), dtype=bool)
    others[1, :, 3] = False
    assert np.allclose(tx[others], 0.95 * SP)


def test_below_capacity_every_port_gets_its_offer() -> None:
    net, off, cap = _four()
    off = SP * np.random.default_rng(3).uniform(0.0, 0.9, size=(4, 144))
    a = net.allocate(off, cap)
    assert np.allclose(a.tx, off)
    assert np.isclose(a.rx.sum(), off.sum())


def test_bundle_counters_wrap_at_64_bits() -> None:
    net, off, cap = _four()
    a = net.allocate(off, cap)
    top = np.uint64(2**64 - 1000)
    net.tx_bytes[:] = top
    net.carry(a, 1.0)
    per = a.up[0, 0] / net.spines  # bytes one spine link carried
    assert per > 1000
    got = int(net.tx_bytes[0, 0, 0, 0])
    assert got == (int(top) + int(per)) % 2**64 or got == (int(top) + int(per) + 1) % 2**64
    assert got < 2**63  # it wrapped
    r = net.bundle_readings()
    assert r["tx_bytes"].dtype == np.uint64
    assert np.allclose(r["utilisation"], 0.95)


def test_congested_bundle_readings_show_the_other_traffic() -> None:
    net, off, cap = _four()
    net.bundle_factor[2, 5, 1] = 0.3
    net.carry(net.allocate(off, cap), 1.0)
    r = net.bundle_readings()
    u = r["utilisation"]
    assert np.allclose(u[:, 2, 5, 1], 1.0)  # saturated: 0.3 ours + 0.7 other traffic
    mask = np.ones(u.shape, dtype=bool)
    mask[:, 2, 5, :] = False
    assert np.allclose(u[mask], 0.95)
    assert r["names"][(2 * 8 + 5) * 4 + 1] == "leaf-p2-r5/spine1"


@pytest.mark.parametrize(("kw", "match"), [
    ({"racks": 1}, "racks"), ({"racks": 9}, "racks"), ({"spines": 0}, "spines"),
    ({"oversubscription": 0.5}, "oversubscription"),
])
def test_bad_construction_raises(kw: dict, match: str) -> None:
    args = {"racks": 3, "trays": 2, "rails": 2, "speed_bytes_per_s": SP} | kw
    with pytest.raises(ValueError, match=match):
        BackendNetwork(args.pop("racks"), args.pop("trays"), args.pop("rails"),
                       args.pop("speed_bytes_per_s"), **args)


def test_bad_allocation_inputs_raise() -> None:
    net = BackendNetwork(3, 2, 2, SP)
    good = np.full((3, 4), SP)
    with pytest.raises(ValueError, match="offered"):
        net.allocate(np.full((3, 5), SP), good)
    with pytest.raises(ValueError, match="capacity"):
        net.allocate(good, -good)
    with pytest.raises(ValueError, match="bundle_factor"):
        net.allocate(good, good, np.full((3, 2, 4), np.nan))
