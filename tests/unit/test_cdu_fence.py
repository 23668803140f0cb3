"""The simulated CDU's controller-epoch fence (sims/cdu/fence.py, issue 15): single-instance
writes unchanged; once an epoch is written, every write from an older epoch or none is refused,
changes nothing (the heartbeat included) and is counted; malformed epochs refused uncounted;
the epoch survives a controller restart; counters saturate."""

from __future__ import annotations

import pytest

from rackplane.errors import WriteRejected
from sims.cdu import CduPlant
from sims.cdu.fence import EPOCH_MAX, ControllerFence


def test_single_instance_writes_carry_no_epoch_and_are_unchanged() -> None:
    plant = CduPlant()
    plant.write("valve_command_pct", 40.0)
    plant.write("heartbeat", 1.0)
    assert plant.readings()["valve_command_pct"] == pytest.approx(40.0)
    assert plant.fence.epoch == 0 and plant.fence.stale_writes == 0


def test_stale_and_epochless_writes_are_refused_counted_and_change_nothing() -> None:
    plant = CduPlant()
    plant.write("valve_command_pct", 40.0, epoch=5)
    assert plant.fence.epoch == 5
    with pytest.raises(WriteRejected, match="stale controller epoch 4"):
        plant.write("valve_command_pct", 90.0, epoch=4)
    with pytest.raises(WriteRejected, match="without a controller epoch"):
        plant.write("valve_command_pct", 90.0)
    assert plant.readings()["valve_command_pct"] == pytest.approx(40.0)
    plant.write("valve_command_pct", 50.0, epoch=9)  # a takeover by a newer epoch
    assert plant.fence.epoch == 9
    with pytest.raises(WriteRejected):
        plant.write("valve_command_pct", 90.0, epoch=5)  # the old holder, fenced
    assert plant.readings()["valve_command_pct"] == pytest.approx(50.0)
    assert plant.fence.stale_writes == 3
    assert plant.fence.stale_by_point() == {"valve_command_pct": 3}


def test_a_stale_heartbeat_does_not_keep_or_restore_remote_control() -> None:
    plant = CduPlant()
    plant.write("heartbeat", 1.0, epoch=7)
    plant.restart_controller()  # local control until the heartbeat changes; epoch kept
    assert plant.readings()["local_control"] == 1.0
    assert plant.fence.epoch == 7
    with pytest.raises(WriteRejected):
        plant.write("heartbeat", 2.0, epoch=6)
    assert plant.readings()["local_control"] == 1.0
    assert plant.readings()["heartbeat"] == 1.0
    assert plant.fence.stale_by_point() == {"heartbeat": 1}
    plant.write("heartbeat", 2.0, epoch=7)
    assert plant.readings()["local_control"] == 0.0


@pytest.mark.parametrize("epoch", [0, -1, EPOCH_MAX + 1, True, 1.5, "3"])
def test_a_malformed_epoch_is_refused_and_not_counted_as_stale(epoch: object) -> None:
    plant = CduPlant()
    with pytest.raises(WriteRejected, match=r"not in 1\.\.2"):
        plant.write("valve_command_pct", 10.0, epoch=epoch)  # type: ignore[arg-type]
    assert plant.fence.epoch == 0 and plant.fence.stale_writes == 0
    plant.write("valve_command_pct", 10.0, epoch=EPOCH_MAX)  # the largest 64-bit epoch
    assert plant.fence.epoch == EPOCH_MAX


def test_the_stale_counter_saturates_at_64_bits() -> None:
    fence = ControllerFence()
    fence.admit("heartbeat", 3)
    fence._stale_writes = EPOCH_MAX  # as after 2**64-1 stale writes
    with pytest.raises(WriteRejected):
        fence.admit("heartbeat", 2)
    assert fence.stale_writes == EPOCH_MAX
