"""racky's configuration (this version: identity, broker, telemetry, power shelves to poll)."""

from __future__ import annotations

from pydantic import Field, model_validator

from rackplane.config import StrictModel
from rackplane.settings import (
    Identity,
    LogSettings,
    ModbusTargetSettings,
    MqttSettings,
    SpoolSettings,
    TsdbSettings,
)


class RackyControl(StrictModel):
    """Timing of racky's tick."""

    tick_s: float = Field(1.0, gt=0, le=60, description="1 Hz: telemetry and detection tick")
    state_interval_s: float = Field(5.0, gt=0, le=600)


class RackyConfig(StrictModel):
    """The whole racky config file."""

    identity: Identity = Identity()
    log: LogSettings = LogSettings()
    mqtt: MqttSettings = MqttSettings()
    tsdb: TsdbSettings = TsdbSettings()
    spool: SpoolSettings = SpoolSettings()
    power_shelves: list[ModbusTargetSettings] = Field(
        default_factory=list, description="power shelves / PDUs polled over Modbus TCP"
    )
    control: RackyControl = RackyControl()

    @model_validator(mode="after")
    def _unique(self) -> RackyConfig:
        names = [s.name for s in self.power_shelves]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"power_shelves: duplicate names {dup}")
        return self
