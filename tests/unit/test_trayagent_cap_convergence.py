"""What the tray agent enforces converges to the last desired state (docs/TRAY-AGENT.md, cap
enforcement), in lock-step through the real agent code and the simulated GPUs
(`harness.simagent.SimTrayFace`, a new limit applied 0.3 s after it was set, seen only in a
later read-back).

The race (demo r13): a cap set, then released (or set to another value) within the device's
apply delay. The read-back still shows the limit from before the set, which equals the new
target, so the agent confirmed the command and set nothing; then the pending set landed and
the GPU held a cap racky had released. Each command here is handled as `TrayAgent._confirm`
handles it (enforce with a read-back every 0.1 s until confirmed, at most
``caps.confirm_timeout_s``); a confirmed command must leave the GPUs at its target once the
device has applied everything, with no read cycle in between."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.simagent import SimTrayFace, agent_config
from rackplane.clock import FakeClock
from rackplane.settings import Identity, MqttSettings
from sims.row import VirtualRack
from sims.workloads import BurnInWorkload
from trayagent.app import TrayAgent
from trayagent.core.caps import limit_action

TRAY = 0
DELAY_S = 0.3


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.vr = VirtualRack(workload=BurnInWorkload(), seed=1, fabric="off")
        self.clock = FakeClock()
        self.face = SimTrayFace(self.vr, limit_delay_s=DELAY_S, clock=self.clock)
        comp = self.vr.compute
        cfg = agent_config(Identity(), MqttSettings(), comp.n_trays, comp.gpus_per_tray,
                           epoch_file=tmp_path / "epochs.json")
        cfg = cfg.model_copy(update={"spool": type(cfg.spool).model_validate(
            {"directory": str(tmp_path / "spool")})})
        gpus, bmcs = self.face.sources()
        self.agent = TrayAgent(cfg, source=gpus, bmcs=bmcs, clock=self.clock)
        self.step(0.1)
        self.agent._cycle(self.agent._targets([TRAY]))  # opens the source, reads every GPU

    def step(self, s: float) -> None:
        for _ in range(round(s / 0.1)):
            self.vr.step(0.1)
            self.clock.advance(0.1)
            self.face.on_step(self.vr, self.clock.monotonic())

    def send(self, **kw: Any) -> None:
        """The command's book change and its first enforcement (no time passes)."""
        ttl = 60.0 if {"power_cap_w", "gpu_power_cap_w"} & set(kw) else None
        self.agent.book.apply([TRAY], 0, now=self.clock.monotonic(), ttl_s=ttl, **kw)
        self.agent._enforce(self.agent._targets([TRAY]), True)

    def confirm(self) -> bool:
        """`TrayAgent._confirm`'s loop, stepping the plant 0.1 s between read-backs."""
        t_end = self.clock.monotonic() + self.agent.cfg.caps.confirm_timeout_s
        while True:
            if self.agent._enforce(self.agent._targets([TRAY]), True):
                return True
            if self.clock.monotonic() >= t_end:
                return False
            self.step(0.1)

    def held(self) -> list[float]:
        s = self.face.snapshot()
        assert s is not None
        return [s.limit_w[g.device] for g in self.agent.gpus[TRAY]]

    def targets(self) -> list[float | None]:
        return [t.watts for t in self.agent._targets([TRAY]).values()]


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    r = Rig(tmp_path)
    r.send(release=["power_cap_w", "gpu_power_cap_w"])  # uncapped: every GPU at its default
    assert r.confirm()
    r.step(1.0)
    dflt = r.agent.gpus[TRAY][0].reading
    assert dflt is not None and r.held() == [dflt.limits.default_w] * 4
    return r


# (set, release) for racky's tray cap and its per-GPU cap; the tray cap is well below the
# GPUs' default (every GPU: 2400 W / 4 less the non-GPU share, at least the device minimum)
CAPS = [({"power_cap_w": 2400.0}, ["power_cap_w"]),
        ({"gpu_power_cap_w": 600.0}, ["gpu_power_cap_w"])]


@pytest.mark.parametrize(("cap", "release"), CAPS, ids=["tray_cap", "gpu_cap"])
def test_a_release_within_the_apply_delay_leaves_the_gpus_at_their_default(
        rig: Rig, cap: dict[str, float], release: list[str]) -> None:
    default = rig.held()
    rig.send(**cap)  # the set is on its way to the GPUs ...
    capped = rig.targets()
    assert all(c is not None and c < d for c, d in zip(capped, default, strict=True))
    rig.step(0.1)
    rig.send(release=release)  # ... when racky releases it (the read-back: still default)
    assert rig.confirm()
    assert rig.targets() == default
    rig.step(2 * DELAY_S)  # everything set has landed; no read cycle ran
    assert rig.held() == default, "the released cap landed after the release"
    assert rig.agent.limit_corrections == 4  # one superseded set per GPU, counted


@pytest.mark.parametrize(("cap", "release"), CAPS, ids=["tray_cap", "gpu_cap"])
def test_set_a_then_set_b_within_the_delay_holds_b(rig: Rig, cap: dict[str, float],
                                                   release: list[str]) -> None:
    (name, a), = cap.items()
    rig.send(**{name: a})
    assert rig.confirm()
    rig.step(1.0)
    at_a = rig.held()
    rig.send(**{name: a * 1.25})  # B: on its way ...
    rig.step(0.1)
    rig.send(**{name: a})  # ... and A again: the read-back (A) equals the target
    assert rig.confirm()
    rig.step(2 * DELAY_S)
    assert rig.held() == at_a, "B landed after A was commanded again"
    rig.send(**{name: a * 1.25})  # and to B, then C, within the delay: C holds
    rig.step(0.1)
    rig.send(**{name: a * 1.5})
    assert rig.confirm()
    rig.step(2 * DELAY_S)
    assert rig.held() == rig.targets()


def test_a_repeated_identical_command_corrects_a_limit_changed_behind_its_back(
        rig: Rig) -> None:
    rig.send(power_cap_w=2400.0)
    assert rig.confirm()
    rig.step(3.0)
    want = rig.held()
    n0 = rig.agent.limit_corrections
    rig.face.request_limit(rig.agent.gpus[TRAY][1].device, 900.0)  # another writer
    rig.step(1.0)
    assert rig.held()[1] == 900.0
    rig.send(power_cap_w=2400.0)  # the same command again: still checked and enforced
    assert rig.confirm()
    rig.step(2 * DELAY_S)
    assert rig.held() == want
    assert rig.agent.limit_corrections == n0 + 1


def test_a_read_cycle_with_targets_from_before_a_command_does_not_undo_it(rig: Rig) -> None:
    """The read loop computes its targets on the event loop, then reads and enforces in a
    worker thread; a command applied in between makes those targets stale."""
    stale, version = rig.agent._targets([TRAY]), rig.agent.book.version
    rig.send(power_cap_w=2400.0)  # a set on its way
    want = rig.targets()
    rig.agent._cycle(stale, version)  # the read cycle that started before the command
    rig.step(2 * DELAY_S)
    assert rig.held() == want


def test_the_sims_gpu_applies_the_later_of_two_pending_limits_last(rig: Rig) -> None:
    dev = rig.agent.gpus[TRAY][2].device
    rig.face.request_limit(dev, 700.0)
    rig.step(0.1)
    rig.face.request_limit(dev, 650.0)
    rig.step(DELAY_S + 0.1)
    assert rig.held()[2] == 650.0
    rig.face.limit_delay_s = 0.5  # a slow set, then a quick one: the later still lands last
    rig.face.request_limit(dev, 700.0)
    rig.face.limit_delay_s = 0.1
    rig.face.request_limit(dev, 640.0)
    rig.step(0.3)
    assert rig.held()[2] == 650.0  # neither yet: the quick one waits for the slow one
    rig.step(0.4)
    assert rig.held()[2] == 640.0


@pytest.mark.parametrize(("read_w", "last_set_w", "since_s", "want"), [
    (600.0, None, 9.0, "held"),  # never set by the agent, read back at the target
    (600.0, 600.0, 0.1, "held"),  # its own set, read back
    (600.0, 750.0, 0.1, "set"),  # another set may still land: set the target again
    (600.0, 750.0, 5.0, "held"),  # that set had its time: the read-back is the truth
    (1200.0, 600.0, 0.1, "wait"),  # the target is on its way
    (1200.0, 600.0, 5.0, "set"),  # ... and did not arrive: set again
    (None, None, 9.0, "set"),
])
def test_limit_action(read_w: float | None, last_set_w: float | None, since_s: float,
                      want: str) -> None:
    assert limit_action(read_w, 600.0, last_set_w, since_s, 1.0, 2.0) == want
