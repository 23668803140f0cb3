"""The simulator in real time behind real protocols (DESIGN §4).

The plant (`ScenarioRun`) steps at 10 Hz on the monotonic clock; after each step its readings
are served by a Modbus TCP face built from the same register map the daemons read, and
client writes (valve command, pump speed, heartbeat, local setpoint) go into the plant. With
a broker configured, the plant's truth and the scenario inputs are published once a second on
``rackplane/<site>/<rack>/sim/telemetry/plant`` (QoS 0), and the scenario's progress on the
retained ``.../sim/state/scenario``; fault starts and ends go to ``.../sim/state/faults``
(retained, the ground truth for scoring detection).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

from rackplane.clock import SYSTEM_CLOCK, Clock
from rackplane.errors import WriteRejected
from rackplane.log import get_logger
from rackplane.mqtt import MqttLink
from rackplane.registers import RegisterMap, load_register_map
from rackplane.service import TickStats, run_ticker
from rackplane.settings import Identity, MqttSettings
from sims.modbus_face import ModbusFace
from sims.scenario import Scenario, ScenarioRun

SIM_DT_S = 0.1


class CduSimulator:
    """A CDU (and its rack's heat) in real time: Modbus face + optional MQTT publisher.

    Args:
        scenario: what to run.
        modbus_host, modbus_port, unit_id: where the CDU answers (port 0 picks a free one).
        mqtt: broker to publish plant truth on (None: no MQTT).
        identity: site/row/rack of the topics.
        register_map: the CDU map (default: the bundled ``cdu-generic``).
        exit_at_end: stop when the scenario's duration is reached (else hold the last inputs).
        ground_truth_path: where to write the faults' ground truth (JSON) at the end.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        modbus_host: str = "127.0.0.1",
        modbus_port: int = 5020,
        unit_id: int = 1,
        mqtt: MqttSettings | None = None,
        identity: Identity | None = None,
        register_map: RegisterMap | None = None,
        exit_at_end: bool = False,
        ground_truth_path: Path | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ):
        self.scenario = scenario
        self.run_ = ScenarioRun(scenario)
        self.clock = clock
        self.log = get_logger("sims.cdu", scenario=scenario.name)
        self.regmap = register_map or load_register_map("cdu-generic")
        self._points = {p.name for p in self.regmap.points}
        self.face = ModbusFace(
            self.regmap,
            unit_ids=(unit_id,),
            host=modbus_host,
            port=modbus_port,
            on_write=self._on_write,
        )
        self.identity = identity or Identity()
        self.mqtt = MqttLink(mqtt, self.identity, "sim", clock=clock) if mqtt else None
        self.exit_at_end = exit_at_end
        self.ground_truth_path = ground_truth_path
        self.tick_stats = TickStats()
        self.rejected_writes = 0
        self._next_publish = 0.0
        self._announced_end = False
        self._faults_published = 0
        self._local = False

    def _on_write(self, point: str, value: float) -> None:
        try:
            self.run_.plant.write(point, value)
        except WriteRejected as err:
            self.rejected_writes += 1
            self.log.warning("plant_write_rejected", point=point, value=value, error=str(err))

    def _serve(self) -> None:
        readings = self.run_.plant.readings()
        self.face.update({k: v for k, v in readings.items() if k in self._points})
        local = bool(readings.get("local_control", 0.0))
        if local != self._local:
            self._local = local
            self.log.warning(
                "cdu_control_source",
                local_control=local,
                note="heartbeat lost" if local else "heartbeat back",
            )

    def _tick(self, now: float, done: asyncio.Event) -> None:
        run = self.run_
        if run.done:
            if not self._announced_end:
                self._announced_end = True
                self.log.info("scenario_complete", t_s=round(run.t_s, 1))
                self._write_ground_truth()
                if self.exit_at_end:
                    done.set()
            # Past the end, the plant keeps running on the scenario's last inputs.
            run.plant.step(run.rack_power_w, run.facility_supply_temp_c, SIM_DT_S)
        else:
            run.step(SIM_DT_S)
        self._serve()
        if self.mqtt is not None and now >= self._next_publish:
            self._next_publish = now + 1.0
            self._publish()

    def _publish(self) -> None:
        assert self.mqtt is not None
        run = self.run_
        tr = run.plant.truth()
        self.mqtt.publish_telemetry(
            "plant",
            {
                "t_s": round(run.t_s, 3),
                "rack_power_w": tr.rack_power_w,
                "facility_supply_temp_c": tr.facility_supply_temp_c,
                "supply_temp_c": tr.supply_temp_c,
                "return_temp_c": tr.return_temp_c,
                "flow_lpm": tr.flow_lpm,
                "valve_position_pct": tr.valve_position_pct,
                "valve_command_pct": tr.valve_command_pct,
                "hottest_gpu_tj_c": tr.hottest_gpu_tj_c,
                "local_control": tr.local_control,
                "ts_ns": self.clock.wall_ns(),
            },
        )
        self.mqtt.publish_state(
            "scenario",
            {
                "name": self.scenario.name,
                "t_s": round(run.t_s, 1),
                "duration_s": self.scenario.duration_s,
                "done": run.done,
            },
        )
        if len(run.ground_truth) != self._faults_published or run.done:
            self._faults_published = len(run.ground_truth)
            self.mqtt.publish_state("faults", {"faults": self.ground_truth()})

    def ground_truth(self) -> list[dict[str, Any]]:
        """Faults injected so far, with plant-time start and end (s)."""
        return [
            {"kind": f.kind, "target": f.target, "start_s": f.start_s, "end_s": f.end_s}
            for f in self.run_.ground_truth
        ]

    def _write_ground_truth(self) -> None:
        if self.ground_truth_path is not None:
            self.ground_truth_path.write_text(
                json.dumps(
                    {
                        "scenario": self.scenario.name,
                        "faults": self.ground_truth(),
                    },
                    indent=2,
                )
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set (or the scenario ends with ``exit_at_end``)."""
        self._serve()
        await self.face.start()
        self.log.info(
            "simulator_started",
            scenario=self.scenario.name,
            modbus_port=self.face.port,
            duration_s=self.scenario.duration_s,
            load=self.run_.load.describe(),
            mqtt=(f"{self.mqtt.settings.host}:{self.mqtt.settings.port}" if self.mqtt else None),
        )
        done = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            mqtt_task = tg.create_task(self.mqtt.run(), name="mqtt") if self.mqtt else None
            ticker = tg.create_task(
                run_ticker(
                    SIM_DT_S, lambda now: self._tick(now, done), self.clock, self.tick_stats
                ),
                name="plant",
            )
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(done.wait())]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            self._write_ground_truth()
            await self.face.stop()
            if self.mqtt is not None and mqtt_task is not None:
                await self.mqtt.stop()
                mqtt_task.cancel()
        self.log.info(
            "simulator_stopped", t_s=round(self.run_.t_s, 1), rejected_writes=self.rejected_writes
        )

    def reload(self) -> None:
        self.log.info("reload_ignored", note="the simulator has no reloadable config")
