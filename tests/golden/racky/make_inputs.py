"""Write the input of each golden case (``<case>/input.json``) from the simulator.

Run from the checkout: ``.venv/bin/python tests/golden/racky/make_inputs.py``; then write the
expected line protocol with ``RACKY_GOLDEN_REGEN=1 .venv/bin/python -m pytest
tests/unit/test_racky_golden.py`` (README.md beside this file).

Cases:

* ``healthy-rack``: the virtual rack (load-step-short, fabric off) for 3 s of lock-step: every
  Modbus sample of the 8 shelves, every tray message, valvey's state, the plant topic and the
  agents' replies racky got before each tick, as recorded from `harness.lockstep_racky`.
* ``faults``: the first tick of ``healthy-rack``, then a tick 130 s later in which shelf0's
  poll failed (BAD ``timeout`` samples), tray 3's message is not the contract, valvey's state
  comes from the broker's retained store an hour old and no other tray has reported since:
  quality codes, stale trays, alarms.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from harness.lockstep_racky import WALL0_NS, run_racky  # noqa: E402
from rackplane.core.samples import Sample  # noqa: E402
from racky.config import RackyConfig  # noqa: E402
from racky.core.controller import RackyCore  # noqa: E402
from racky.tick import RackyTick, TickEffects  # noqa: E402
from sims.scenario import FabricSpec, load_scenario  # noqa: E402


def _sample(s: Sample) -> list[Any]:
    return [s.point, s.value, s.unit, s.ts_ns, s.t_mono, s.quality.name, s.reason]


class _Recorder(RackyTick):
    """A `RackyTick` that records its inputs per tick."""

    def __init__(self, cfg: RackyConfig, core: RackyCore) -> None:
        super().__init__(cfg, core, 0.0)
        self.ticks: list[dict[str, Any]] = []
        self._cur: dict[str, Any] = {"shelves": {}, "messages": []}

    def shelf_samples(self, device: str, samples: Any) -> None:
        samples = list(samples)
        self._cur["shelves"][device] = [_sample(s) for s in samples]
        super().shelf_samples(device, samples)

    def message(self, topic: str, payload: bytes, *, retain: bool, received_mono: float,
                wall_ns: int) -> None:
        self._cur["messages"].append({"topic": topic, "payload": payload.decode(),
                                      "retain": retain, "received_mono": received_mono,
                                      "wall_ns": wall_ns})
        super().message(topic, payload, retain=retain, received_mono=received_mono,
                        wall_ns=wall_ns)

    def step(self, now_mono: float, wall_ns: int,
             extra_alarms: Any = None) -> TickEffects:
        self._cur.update(t_mono=now_mono, wall_ns=wall_ns)
        self.ticks.append(self._cur)
        self._cur = {"shelves": {}, "messages": []}
        return super().step(now_mono, wall_ns, extra_alarms)


def main() -> None:
    rec: list[_Recorder] = []

    def factory(cfg: RackyConfig, core: RackyCore) -> RackyTick:
        rec.append(_Recorder(cfg, core))
        return rec[-1]

    sc = load_scenario("load-step-short").model_copy(
        update={"fabric": FabricSpec(enabled="off")})
    run_racky(sc, duration_s=2.0, tick_factory=factory)
    cfg = rec[0].cfg
    healthy = {"config": {"cooling": {"plant_topic": cfg.cooling.plant_topic}},
               "ticks": rec[0].ticks}
    first = rec[0].ticks[0]
    t, wall = 130.0, WALL0_NS + 130 * 10**9
    shelves = {}
    for name, samples in first["shelves"].items():
        if name == "shelf0":
            shelves[name] = [[p, None, u, wall, t, "BAD", "timeout"]
                             for p, _, u, *_ in samples]
        else:
            shelves[name] = [[p, v, u, wall, t, q, r] for p, v, u, _, _, q, r in samples]
    cooling = next(m for m in first["messages"] if "/state/" in m["topic"])
    tray3 = next(m for m in first["messages"] if m["topic"].endswith("/telemetry/tray03"))
    old = json.loads(cooling["payload"])
    old["ts_ns"] = wall - 3600 * 10**9
    faults = {"config": healthy["config"], "ticks": [first, {
        "t_mono": t, "wall_ns": wall, "shelves": shelves, "messages": [
            {**tray3, "payload": '{"tray": 3}', "received_mono": t, "wall_ns": wall},
            {**cooling, "payload": json.dumps(old), "retain": True, "received_mono": t,
             "wall_ns": wall},
        ]}]}
    for case, data in (("healthy-rack", healthy), ("faults", faults)):
        d = HERE / case
        d.mkdir(exist_ok=True)
        (d / "input.json").write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {d / 'input.json'}")


if __name__ == "__main__":
    main()
