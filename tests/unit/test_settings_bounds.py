"""Every numeric setting of the shared settings (rackplane/settings.py,
rackplane/leadership_settings.py) has an upper bound: ``telemetry_queue_max =
9223372036854775807`` (or an infinite interval) was accepted by all four daemons."""

from __future__ import annotations

import inspect
import types

import annotated_types as at
import pytest
from pydantic import BaseModel, ValidationError

import rackplane.leadership_settings as leadership_settings
import rackplane.settings as settings


def _numeric_fields() -> list[tuple[type[BaseModel], str]]:
    out = []
    for mod in (settings, leadership_settings):
        for cls in vars(mod).values():
            if not (inspect.isclass(cls) and issubclass(cls, BaseModel)
                    and cls.__module__ == mod.__name__):
                continue
            for name, info in cls.model_fields.items():
                ann = info.annotation
                args = set(ann.__args__) if isinstance(ann, types.UnionType) else {ann}
                if args & {int, float} and bool not in args:
                    out.append((cls, name))
    return out


def test_every_shared_numeric_setting_has_an_upper_bound() -> None:
    fields = _numeric_fields()
    assert len(fields) > 30, fields  # the walk found the settings
    unbounded = [f"{cls.__name__}.{name}" for cls, name in fields
                 if not any(isinstance(m, at.Le | at.Lt)
                            for m in cls.model_fields[name].metadata)]
    assert unbounded == []


@pytest.mark.parametrize(("field", "value"), [
    ("telemetry_queue_max", 9_223_372_036_854_775_807),
    ("outbox_max", 10**12),
    ("reconnect_max_s", 1e9),
    ("session_expiry_s", 2**40),
])
def test_absurd_mqtt_settings_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValidationError, match=field):
        settings.MqttSettings.model_validate({field: value})
    settings.MqttSettings.model_validate({})  # the defaults stay valid


def test_absurd_spool_and_tsdb_settings_are_refused() -> None:
    with pytest.raises(ValidationError, match="memory_max_lines"):
        settings.SpoolSettings.model_validate({"memory_max_lines": 10**15})
    with pytest.raises(ValidationError, match="retry_max_s"):
        settings.TsdbSettings.model_validate({"retry_max_s": float("inf")})
