"""Register maps as validated data: the TOML format's models (`RegisterMap`, `PointSpec`,
`DeviceInfo`), the protocol's limits and loading a map, bundled or from a file (the format is
the `rackplane.core.registers` docstring).
"""

from __future__ import annotations

import importlib.resources
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from rackplane.config import StrictModel, read_toml, validate_data
from rackplane.errors import ConfigError

__all__ = [
    "BIT_TABLES",
    "MAX_READ_BITS",
    "MAX_READ_REGISTERS",
    "READ_FUNCTION",
    "REGISTER_TABLES",
    "SHRINK_LADDER",
    "TABLES",
    "TINY_FLOAT_ABS",
    "TYPE_WORDS",
    "DataType",
    "DeviceInfo",
    "PointSpec",
    "RegisterMap",
    "Table",
    "WordOrder",
    "bundled_register_maps",
    "load_register_map",
    "parse_register_map",
]

Table = Literal["holding", "input", "coil", "discrete"]
DataType = Literal[
    "int16", "uint16", "int32", "uint32", "float32", "int64", "uint64", "float64", "bool"
]
WordOrder = Literal["ABCD", "CDAB", "BADC", "DCBA"]

TABLES: tuple[Table, ...] = get_args(Table)
BIT_TABLES: frozenset[str] = frozenset({"coil", "discrete"})
REGISTER_TABLES: frozenset[str] = frozenset({"holding", "input"})

#: Registers per value of each type (a bool is one register, or one bit in a bit table).
TYPE_WORDS: Mapping[str, int] = {
    "int16": 1, "uint16": 1, "bool": 1,
    "int32": 2, "uint32": 2, "float32": 2,
    "int64": 4, "uint64": 4, "float64": 4,
}
_SIGNED = frozenset({"int16", "int32", "int64"})
_FLOATS = frozenset({"float32", "float64"})
_WORD_SWAP = frozenset({"CDAB", "DCBA"})
_BYTE_SWAP = frozenset({"BADC", "DCBA"})

#: Read function code of each table (Modbus spec §6.1-6.4).
READ_FUNCTION: Mapping[str, int] = {"coil": 1, "discrete": 2, "holding": 3, "input": 4}

#: Protocol limits per read request: 125 registers (FC03/FC04), 2000 bits (FC01/FC02),
#: MODBUS Application Protocol Specification V1.1b3 §6.1-6.4.
MAX_READ_REGISTERS = 125
MAX_READ_BITS = 2000

#: Request sizes tried after an exception 3 (illegal data value) on a multi-point read: the
#: next value below the rejected count. Common device limits (125 protocol maximum, 120, 100,
#: 64 ...) come first so a device limited to 100 (FIELD-CASES BR-05) is found exactly.
SHRINK_LADDER: tuple[int, ...] = (125, 120, 100, 64, 50, 32, 16, 8, 4, 2, 1)

#: |value| below this from a float point is taken as a probable byte/word-order
#: misconfiguration (FIELD-CASES BR-01: 1.0 read with the wrong word order is ~2.3e-41).
TINY_FLOAT_ABS = 1e-30

_POINT_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_DEVICE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_REL_TOL = 1e-9


# --- models ----------------------------------------------------------------------------------


class DeviceInfo(StrictModel):
    """The ``[device]`` table of a register map."""

    name: str
    description: str = ""
    default_order: WordOrder = "ABCD"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _DEVICE_NAME_RE.fullmatch(v):
            raise ValueError(
                "must be 1-64 characters of letters, digits, '_', '.', ':' or '-', starting "
                "with a letter or digit (it is a topic level and a tag value)"
            )
        return v


class PointSpec(StrictModel):
    """One point of a register map (see the module docstring for the TOML keys).

    ``order`` is always concrete once the point belongs to a validated `RegisterMap` (the
    device's ``default_order`` is filled in for multi-register types).
    """

    name: str
    table: Table
    address: int = Field(ge=0, le=65535, description="0-based protocol address")
    type: DataType
    order: WordOrder = "ABCD"
    scale: float = Field(1.0, gt=0, allow_inf_nan=False)
    offset: float = Field(0.0, allow_inf_nan=False)
    unit: str = ""
    description: str = ""
    valid_min: float | None = Field(None, allow_inf_nan=False)
    valid_max: float | None = Field(None, allow_inf_nan=False)
    sentinels: tuple[int, ...] = ()
    writable: bool = False
    write_min: float | None = Field(None, allow_inf_nan=False)
    write_max: float | None = Field(None, allow_inf_nan=False)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _POINT_NAME_RE.fullmatch(v):
            raise ValueError(
                "point names are time-series field names and topic levels: 1-64 characters "
                "of lower-case letters, digits and '_', starting with a letter"
            )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> PointSpec:
        width = 1 if self.table in BIT_TABLES else TYPE_WORDS[self.type]
        if self.address + width - 1 > 65535:
            raise ValueError(
                f"address {self.address} + {width} registers runs past 65535"
            )
        if self.table in BIT_TABLES and self.type != "bool":
            raise ValueError(f"a {self.table} point holds one bit: type must be 'bool'")
        if self.type == "bool" and (self.scale != 1.0 or self.offset != 0.0):
            raise ValueError("a bool point has no scale or offset")
        if self.writable and self.table not in ("holding", "coil"):
            raise ValueError(f"only holding and coil points can be writable, not {self.table}")
        if (
            self.valid_min is not None
            and self.valid_max is not None
            and self.valid_min > self.valid_max
        ):
            raise ValueError("valid_min must be <= valid_max")
        if self.writable and self.type != "bool" and (
            self.write_min is None or self.write_max is None
        ):
            raise ValueError("a writable point needs write_min and write_max")
        if (self.write_min is not None or self.write_max is not None) and not self.writable:
            raise ValueError("write_min / write_max given on a point that is not writable")
        if self.write_min is not None and self.write_max is not None:
            if self.write_min > self.write_max:
                raise ValueError("write_min must be <= write_max")
            lo = -math.inf if self.valid_min is None else self.valid_min
            hi = math.inf if self.valid_max is None else self.valid_max
            if self.write_min < lo or self.write_max > hi:
                raise ValueError(
                    f"write limits [{self.write_min}, {self.write_max}] must lie inside the "
                    f"valid range [{self.valid_min}, {self.valid_max}]"
                )
        bits = 16 * TYPE_WORDS[self.type]
        for s in self.sentinels:
            if self.type == "bool":
                raise ValueError("a bool point cannot have sentinels")
            if not 0 <= s < 2**bits:
                raise ValueError(
                    f"sentinel {s} does not fit {self.type}: give the raw unsigned value "
                    f"(0 .. {2**bits - 1:#x}), e.g. 0x8000 for an int16 -32768"
                )
        return self

    @property
    def words(self) -> int:
        """Registers the point occupies (1 for a bit-table point: one bit)."""
        return 1 if self.table in BIT_TABLES else TYPE_WORDS[self.type]

    @property
    def end(self) -> int:
        """Last address the point occupies (inclusive)."""
        return self.address + self.words - 1


class RegisterMap(StrictModel):
    """A validated register map: ``[device]`` and ``[[points]]``.

    Validation (errors name the key path): unique point names; no two points of one table
    share a register; bit tables hold only bools; writable only on holding/coil, with write
    limits inside the valid range; sentinels fit the type width; names are topic/field safe.
    """

    device: DeviceInfo
    points: tuple[PointSpec, ...] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _fill_orders(cls, data: Any) -> Any:
        """Give multi-register points without ``order`` the device's ``default_order``."""
        if not isinstance(data, dict):
            return data
        device = data.get("device")
        points = data.get("points")
        default = device.get("default_order", "ABCD") if isinstance(device, dict) else "ABCD"
        if not isinstance(points, list | tuple):
            return data
        filled: list[Any] = []
        for p in points:
            if isinstance(p, dict) and "order" not in p:
                words = TYPE_WORDS.get(str(p.get("type")), 1)
                if words > 1 and p.get("table") not in BIT_TABLES:
                    p = {**p, "order": default}
            filled.append(p)
        return {**data, "points": filled}

    @model_validator(mode="after")
    def _cross_point(self) -> RegisterMap:
        problems: list[str] = []
        seen: dict[str, int] = {}
        for i, p in enumerate(self.points):
            if p.name in seen:
                problems.append(
                    f"points[{i}].name: duplicate point name {p.name!r} "
                    f"(first at points[{seen[p.name]}])"
                )
            else:
                seen[p.name] = i
        for table in TABLES:
            spans = sorted(
                (p.address, p.end, i, p.name)
                for i, p in enumerate(self.points)
                if p.table == table
            )
            for (a0, e0, i0, n0), (a1, e1, i1, n1) in itertools.pairwise(spans):
                if a1 <= e0:
                    problems.append(
                        f"points[{i1}].address: {n1!r} ({table} {a1}-{e1}) overlaps "
                        f"points[{i0}] {n0!r} ({table} {a0}-{e0})"
                    )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @cached_property
    def by_name(self) -> Mapping[str, PointSpec]:
        """Points by name."""
        return {p.name: p for p in self.points}

    @cached_property
    def encoders(self) -> Mapping[str, Callable[[float, bool], Sequence[int] | None]]:
        """Each point's compiled encoder by name
        (`rackplane.core.registers.encoder.compile_point_encoder`), built once per map."""
        from rackplane.core.registers.encoder import compile_point_encoder  # it imports us

        return {p.name: compile_point_encoder(p) for p in self.points}

    def point(self, name: str) -> PointSpec:
        """The point called ``name``.

        Raises:
            KeyError: no such point (the message lists nothing else: maps can be large).
        """
        try:
            return self.by_name[name]
        except KeyError:
            raise KeyError(f"register map {self.device.name!r} has no point {name!r}") from None


# --- loading ---------------------------------------------------------------------------------


def bundled_register_maps() -> list[str]:
    """Names of the register maps shipped in ``rackplane_config/registers``."""
    folder = importlib.resources.files("rackplane_config") / "registers"
    return sorted(
        e.name[: -len(".toml")] for e in folder.iterdir() if e.name.endswith(".toml")
    )


def parse_register_map(data: dict[str, Any], source: str = "<register map>") -> RegisterMap:
    """Validate a parsed TOML mapping into a `RegisterMap`.

    Raises:
        ConfigError: every problem, as ``<source>: <key.path>: <message>``.
    """
    return validate_data(RegisterMap, data, source)


def load_register_map(ref: str | Path) -> RegisterMap:
    """Load a register map.

    Args:
        ref: a bare name (one path part, no suffix, e.g. ``"cdu-generic"``) is a bundled map,
            ``rackplane_config/registers/<name>.toml`` (found with importlib.resources, so it
            works from a checkout and from an installed wheel); anything else is a file path.

    Raises:
        ConfigError: unknown bundled name (the available ones are listed), file missing or
            unreadable, invalid TOML, or any validation problem (file and key path named).
    """
    p = Path(ref)
    if len(p.parts) == 1 and p.suffix == "":
        resource = importlib.resources.files("rackplane_config") / "registers" / f"{p.name}.toml"
        if not resource.is_file():
            raise ConfigError(
                f"no bundled register map {p.name!r}; bundled maps: "
                f"{', '.join(bundled_register_maps()) or '(none)'}",
                path=str(ref),
            )
        with importlib.resources.as_file(resource) as real:
            return parse_register_map(read_toml(real), str(real))
    return parse_register_map(read_toml(p), str(p))
