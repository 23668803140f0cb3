"""racky wires power shelves behind one Modbus TCP gateway (same host:port) onto one shared
connection (issue 14 item 5; the behaviour of the shared connection is tested against a real
Modbus server in tests/adapters/test_modbus_gateway.py)."""

from __future__ import annotations

from pathlib import Path

from rackplane.clock import FakeClock
from racky.app import Racky
from racky.config import RackyConfig


def test_shelves_at_one_address_share_one_link(tmp_path: Path) -> None:
    shelves = [{"name": f"shelf{u}", "host": "10.0.0.5", "port": 502, "unit_id": u,
                "register_map": "power-shelf"} for u in (1, 2, 3)]
    shelves.append({"name": "other", "host": "10.0.0.6", "port": 502, "unit_id": 1,
                    "register_map": "power-shelf"})
    cfg = RackyConfig.model_validate({
        "power_shelves": shelves,
        "lifecycle": {"state_file": str(tmp_path / "racky-state.json")},
        "spool": {"directory": str(tmp_path / "spool")},
    })
    racky = Racky(cfg, clock=FakeClock(start_mono=1000.0, start_wall_ns=1_800_000_000 * 10**9))
    assert len(racky.links) == 2
    gateway = racky.links.get(cfg.power_shelves[0])
    assert [m.name for m in gateway.members] == ["shelf1", "shelf2", "shelf3"]
    assert racky.links.get(cfg.power_shelves[3]).members == [racky.devices["other"]]
