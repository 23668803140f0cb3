"""valvey's command state across restarts: the setpoint and loop mode set by command (issue 7:
a restart must not silently revert an operator's decision).

One `rackplane.io.statefile.StateFile` (format `STATE_FORMAT`, version `STATE_VERSION`), by
default ``valvey-state-<rack>.json`` beside the spool folder (``$STATE_DIRECTORY`` under
systemd; `state_file_path`; the rack in the name keeps two daemons whose spools share a parent
folder apart). Its ``data``::

    {"owner": "lab/row1/rack1",     # identity site/row/rack of the daemon that saved it
                                    # (files of older versions: site/rack, still accepted)
     "setpoint_c": 44.0,            # the operator's setpoint (°C) when it was saved
     "file_setpoint_c": 45.0,       # supply_loop.setpoint_c of the config at that moment
     "manual_output_pct": null,     # manual mode's output (%), null: not manual
     "shadow": false,               # shadow mode
     "file_shadow": false,          # supply_loop.shadow of the config at that moment
     "learned": {                   # what the controller learned of its plant (issue 21)
       "valve_stroke_s": {"a": 118.7},          # learned stroke time by valve, s
       "valve_rest_pct": {"a": [0.3, 0.5]},     # feedback − command at rest, scatter, %
       "ff_map_powers_kw": [0, 20, ...],        # feedforward.valve_map's powers (the prior)
       "ff_map_prior_pct": [0, 47, ...],        # ... and its valve % when the map was learned
       "ff_map_pct": [0, 47.3, ...] | null,     # the learned valve %, null: the prior
       "commissioned": {                         # accepted auto-commissioning gains, or null
         "kc_pct_per_k": 34.2, "ti_s": 40.0, "ff_gain": 1.13,
         "file_kc_pct_per_k": 18.9, "file_ti_s": 20.0, "file_ff_gain": 1.0},
       "liquid_fraction": {                      # learned liquid fraction (0-1), or null
         "value": 0.874,                         # (3 decimals, saved in 0.005 steps)
         "file_liquid_fraction": 0.85,           # capacity.liquid_fraction then (the prior)
         "file_inputs": ["heat_removed_kw", "rack_power_w"]},  # points.heat_removed,
                                                 # safety.rack_power then
       "exchanger": {                            # measured valve-open conductance, or null
         "k_open_kw_per_k": 11.93,               # kW/K (4 digits, saved in 1 % steps)
         "file_cdu": "10.0.4.21:502/1",          # cdu host:port/unit_id then (or serial:…)
         "file_points": ["heat_removed_kw", "return_temp_c", "facility_supply_temp_c"]},
       "confirmed_wall_s": {                     # when each was last confirmed by a
         "valve_stroke_s.a": 1764680000,         # measurement: s since the Unix epoch
         "ff_map_pct": 1764683600, "k_open_kw_per_k": 1764690000, ...}}}  # (valvey.learned_age)

**Learned values** are restored at start (`apply_learned`) unless the configured
``feedforward.valve_map`` changed since they were learned (the file wins: an operator who
edits the prior starts afresh), and only within their bounds (``valves.stroke_min_s``–
``stroke_max_s``; the map within ``feedforward.adapt_max_correction_pct`` of the prior, 0–100 %,
not falling with power); anything else is dropped and logged as superseded. A file without
``learned`` (saved before issue 21) restores nothing learned. ``ValveyCore.reset_learned``
forgets them (back to the cold-start prior). Accepted commissioning gains
(`valvey.core.commissioning`) are restored only while the configured ``supply_loop.kc_pct_per_k``,
``ti_s`` and ``feedforward.gain`` are still the ones they replaced (``file_*``) and they are
within the ``commissioning`` bounds. The capacity guard's learned values (`valvey.core.capacity`):
the **liquid fraction** is restored only while ``capacity.liquid_fraction`` (its prior) and
its inputs (``file_inputs``) are unchanged, ``learn_liquid_fraction`` is on, and within
[``capacity.liquid_fraction_min``, ``liquid_fraction_max``]; the exchanger's **valve-open
conductance** ``k_open`` only while the CDU and its points (``file_cdu``, ``file_points``) are
unchanged and within `valvey.core.capacity.k_open_window`: at least ``liquid_fraction_min ×
min_cap_w`` over ``supply_loop.setpoint_max_c`` K (an exchanger that could not carry the
lowest cap's heat even with 0 °C facility water: a heat meter in MW), below 0.95 × ρc × the
most flow the config allows (``pump_loop.flow_setpoint_max_lpm``, or
``safety.design_flow_lpm`` when larger) / 60 (k = ε·C_min ≤ C_s). Restored, both say so in
the state (``safety.liquid_fraction_source``, ``supply_loop.capacity_w_per_k_source``:
``restored``) until this run has learned or measured as much again (then ``learned`` /
``measured``; a first valve-open sample more than 3 % off replaces a restored ``k_open`` at
once: the exchanger changed meanwhile). Not persisted: the highest rack power seen (it stands
in for an unset ``capacity.rack_max_power_w`` and must never exceed the rack's true maximum:
a rack swapped during the restart would break that), the estimate's correction and a stuck
valve's conductance (transients).

**Age** (`valvey.learned_age`): each learned value is restored as above only while it was
last confirmed by a measurement at most ``control.learned_max_age_s`` ago (30 days by
default; wall clock: the stamps survive a restart); one older, or of unknown age (no stamp: a
file saved before the stamps existed; a stamp in the future: the clock stepped back), is
dropped and re-learned (valve strokes and rest characteristic, liquid fraction, ``k_open``: an
old one could overstate the capacity) or restored as a starting point only (the feedforward
map, commissioning gains), keeping its old stamp. Each value is logged at start: restored
(``command_state_restored``, its age in ``learned_age_s``), kept as a starting point (in
``restored``, with why), dropped for age or for a config change (``command_state_superseded``).

Keys added to ``learned`` keep the format at version 1: a file without them (an older
build's) restores nothing of them, and an older build reading a newer file ignores them.

**File vs command (the newer decision wins).** Each saved value carries the config value it
was saved against. At start (and at SIGHUP, `Valvey.reload`), a saved setpoint (or shadow
flag) is used only while the config still has the value recorded with it; once the config's
value differs, the file was edited after the command and the file wins: the saved value is
dropped (logged ``command_state_superseded``) and the next save records the file's value.
Manual mode has no config counterpart: it is kept until a command (or an interlock) ends it.

A damaged file, one of another format, or one of a newer version is moved aside
(``.bad-<ns>``), logged (``state_file_unusable``, naming why) and the config values are used.
A file saved by another rack's valvey (``owner`` differs: two daemons sharing one state
folder) is never applied: logged (``state_file_unusable``) and the config's values used; give
each daemon its own ``control.state_file`` then. The leases are not persisted: a restart drops
them (holders re-acquire).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rackplane.errors import CommandError
from rackplane.io.statefile import StateFile
from rackplane.paths import in_state_directory
from rackplane.settings import SpoolSettings
from valvey.core.capacity import k_open_window
from valvey.core.commissioning import Accepted
from valvey.core.controller import ValveyCore
from valvey.core.supply_loop import SupplyLoop
from valvey.core.supply_loop_settings import SupplyLoopSettings
from valvey.learned_age import WHEN_OLD, LearnedAges, age_s, describe_age, kind_of

STATE_FORMAT = "valvey-state"
STATE_VERSION = 1
DEFAULT_NAME = "valvey-state-{rack}.json"

__all__ = [
    "DEFAULT_NAME",
    "STATE_FORMAT",
    "STATE_VERSION",
    "CommandState",
    "LearnedExchanger",
    "LearnedLiquid",
    "LearnedState",
    "apply_command_state",
    "apply_learned",
    "open_state_file",
    "state_file_path",
    "sync_command_state",
]


def state_file_path(
    state_file: Path | None, spool: SpoolSettings, rack: str,
    environ: dict[str, str] | None = None,
) -> Path:
    """Where the state file lives: ``state_file`` absolute as given, relative inside
    ``$STATE_DIRECTORY`` (first entry) or the working directory; None: `DEFAULT_NAME`
    (``rack``: ``identity.rack``) in the parent of the configured spool folder, or (spool
    folder unset: one per daemon under ``spool/``) where the default spool used to be: the
    working directory or ``$STATE_DIRECTORY``."""
    if state_file is None:
        name = DEFAULT_NAME.format(rack=rack)
        if spool.directory is None:
            return in_state_directory(Path(name), environ)
        return in_state_directory(spool.directory, environ).parent / name
    return in_state_directory(state_file, environ)


def open_state_file(path: Path, log: Any = None) -> StateFile:
    """The `StateFile` of valvey's command state at ``path``."""
    return StateFile(path, STATE_FORMAT, STATE_VERSION, log=log)


@dataclass(frozen=True, slots=True)
class CommandState:
    """What is saved (see the module docstring); equality tells whether a save is due."""

    owner: str
    setpoint_c: float
    file_setpoint_c: float
    manual_output_pct: float | None
    shadow: bool
    file_shadow: bool
    learned: LearnedState | None = None

    @classmethod
    def of(cls, owner: str, loop: SupplyLoop, file: SupplyLoopSettings,
           learned: LearnedState | None = None) -> CommandState:
        """The loop's current command state against the config's ``supply_loop`` (and what
        the core learned, `LearnedState.of`)."""
        return cls(owner, loop.setpoint_c, file.setpoint_c, loop.manual_target_pct, loop.shadow,
                   file.shadow, learned)

    def data(self) -> dict[str, Any]:
        """The state file's ``data`` object."""
        d = asdict(self)
        d["learned"] = None if self.learned is None else self.learned.data()
        return d

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> CommandState:
        """Parse a ``data`` object.

        Raises:
            ValueError: a field missing or of the wrong type.
        """
        def num(key: str, none_ok: bool = False) -> Any:
            v = data.get(key)
            if v is None and none_ok:
                return None
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"{key}: expected a number, got {v!r}")
            return float(v)

        def flag(key: str) -> bool:
            v = data.get(key)
            if not isinstance(v, bool):
                raise ValueError(f"{key}: expected true/false, got {v!r}")
            return v

        owner = data.get("owner")
        if not isinstance(owner, str):
            raise ValueError(f"owner: expected 'site/row/rack', got {owner!r}")
        lv = data.get("learned")
        return cls(owner, num("setpoint_c"), num("file_setpoint_c"),
                   num("manual_output_pct", none_ok=True), flag("shadow"), flag("file_shadow"),
                   None if lv is None else LearnedState.from_data(lv))


def _nums(v: Any, key: str) -> tuple[float, ...]:
    if not isinstance(v, list) or len(v) > 64 or any(
            isinstance(x, bool) or not isinstance(x, int | float) for x in v):
        raise ValueError(f"learned.{key}: expected a list of at most 64 numbers, got {v!r}")
    return tuple(float(x) for x in v)


@dataclass(frozen=True, slots=True)
class LearnedState:
    """What the core learned of its plant (module docstring); values rounded (0.1 s, 0.01 %)
    so that a save is due only for a real change."""

    valve_stroke_s: tuple[tuple[str, float], ...]
    ff_map_powers_kw: tuple[float, ...]
    ff_map_prior_pct: tuple[float, ...]
    ff_map_pct: tuple[float, ...] | None
    valve_rest_pct: tuple[tuple[str, float, float], ...] = ()
    commissioned: Accepted | None = None
    liquid_fraction: LearnedLiquid | None = None
    exchanger: LearnedExchanger | None = None
    confirmed_wall_s: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, core: ValveyCore, ages: LearnedAges | None = None) -> LearnedState:
        """The core's learned values now, with their confirmation stamps from ``ages``
        (None: none, as a simulation that never restarts)."""
        st = cls._of(core)
        return st if ages is None else replace(
            st, confirmed_wall_s=ages.stamps(st.value_names()))

    def value_names(self) -> list[str]:
        """The names of the values present (as in ``confirmed_wall_s``)."""
        names = [f"valve_stroke_s.{k}" for k, _ in self.valve_stroke_s]
        names += [f"valve_rest_pct.{k}" for k, _, _ in self.valve_rest_pct]
        for name, v in (("ff_map_pct", self.ff_map_pct), ("commissioned", self.commissioned),
                        ("liquid_fraction", self.liquid_fraction),
                        ("k_open_kw_per_k", self.exchanger)):
            if v is not None:
                names.append(name)
        return names

    def ages_s(self, wall_s: float) -> dict[str, int | None]:
        """Age of each value present at wall time ``wall_s`` [s since the epoch], whole s;
        None: unknown (`valvey.learned_age.age_s`)."""
        st = dict(self.confirmed_wall_s)
        out: dict[str, int | None] = {}
        for n in self.value_names():
            a = age_s(st.get(n), wall_s)
            out[n] = None if a is None else round(a)
        return out

    @classmethod
    def _of(cls, core: ValveyCore) -> LearnedState:
        ff = core.ff
        vm = ff.settings.valve_map
        liq = core.capacity.liquid.saved
        k_open = core.capacity.k_open_saved
        return cls(
            tuple(sorted((k, round(v, 1)) for k, v in core.valves.learned().items())),
            tuple(float(p[0]) for p in vm), tuple(float(p[1]) for p in vm),
            tuple(round(y, 2) for _, y in ff.valve_map) if ff.map_learned else None,
            tuple(sorted((k, round(o, 1), round(b, 1))
                         for k, (o, b) in core.valves.learned_rest().items())),
            core.commissioning.accepted,
            None if liq is None else LearnedLiquid(liq, *_liquid_basis(core)),
            None if k_open is None else LearnedExchanger(k_open, *_exchanger_basis(core)))

    def data(self) -> dict[str, Any]:
        """The ``learned`` object of the state file."""
        return {"valve_stroke_s": dict(self.valve_stroke_s),
                "ff_map_powers_kw": list(self.ff_map_powers_kw),
                "ff_map_prior_pct": list(self.ff_map_prior_pct),
                "ff_map_pct": None if self.ff_map_pct is None else list(self.ff_map_pct),
                "valve_rest_pct": {k: [o, b] for k, o, b in self.valve_rest_pct},
                "commissioned": None if self.commissioned is None else dict(
                    zip(_COMMISSIONED, self.commissioned, strict=True)),
                "liquid_fraction": None if self.liquid_fraction is None else {
                    "value": self.liquid_fraction.value,
                    "file_liquid_fraction": self.liquid_fraction.file_liquid_fraction,
                    "file_inputs": list(self.liquid_fraction.file_inputs)},
                "exchanger": None if self.exchanger is None else {
                    "k_open_kw_per_k": self.exchanger.k_open_kw_per_k,
                    "file_cdu": self.exchanger.file_cdu,
                    "file_points": list(self.exchanger.file_points)},
                "confirmed_wall_s": dict(self.confirmed_wall_s)}

    @classmethod
    def from_data(cls, data: Any) -> LearnedState:
        """Parse a ``learned`` object. Raises ValueError for a wrong shape or type (bounds are
        `apply_learned`'s)."""
        if not isinstance(data, dict):
            raise ValueError(f"learned: expected an object, got {data!r}")
        st = data.get("valve_stroke_s", {})
        if not isinstance(st, dict) or len(st) > 8 or any(
                not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int | float)
                for k, v in st.items()):
            raise ValueError(f"learned.valve_stroke_s: expected {{valve: seconds}}, got {st!r}")
        m = data.get("ff_map_pct")
        rest = data.get("valve_rest_pct", {})
        if not isinstance(rest, dict) or len(rest) > 8 or any(
                not isinstance(k, str) or len(_nums(v, "valve_rest_pct")) != 2
                for k, v in rest.items()):
            raise ValueError(f"learned.valve_rest_pct: expected {{valve: [offset, scatter]}}, "
                             f"got {rest!r}")
        return cls(tuple(sorted((k, float(v)) for k, v in st.items())),
                   _nums(data.get("ff_map_powers_kw", []), "ff_map_powers_kw"),
                   _nums(data.get("ff_map_prior_pct", []), "ff_map_prior_pct"),
                   None if m is None else _nums(m, "ff_map_pct"),
                   tuple(sorted((k, float(v[0]), float(v[1])) for k, v in rest.items())),
                   _commissioned(data.get("commissioned")),
                   _liquid(data.get("liquid_fraction")), _exchanger(data.get("exchanger")),
                   _stamps(data.get("confirmed_wall_s", {})))


def _stamps(v: Any) -> tuple[tuple[str, int], ...]:
    """Parse ``learned.confirmed_wall_s`` (absent in files of older builds: ``{}``). Raises
    ValueError for a wrong shape (a stamp out of any clock's range is kept: age unknown)."""
    if not isinstance(v, dict) or len(v) > 64 or any(
            not isinstance(k, str) or len(k) > 100 or not _number(x) or not math.isfinite(x)
            for k, x in v.items()):
        raise ValueError("learned.confirmed_wall_s: expected {name: seconds since the epoch}, "
                         f"got {v!r}")
    return tuple(sorted((k, int(x)) for k, x in v.items()))


@dataclass(frozen=True, slots=True)
class LearnedLiquid:
    """The learned liquid fraction (0-1) and the config it was learned against: the
    configured prior ``capacity.liquid_fraction`` and its inputs (``points.heat_removed``,
    ``safety.rack_power``: the ratio's heat meter and rack power)."""

    value: float
    file_liquid_fraction: float
    file_inputs: tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class LearnedExchanger:
    """The measured valve-open conductance [kW/K] and what it was measured on: the CDU
    (``host:port/unit``, or ``serial:<port>/unit``) and its points (``points.heat_removed``,
    ``return_temp``, ``facility_supply_temp``)."""

    k_open_kw_per_k: float
    file_cdu: str
    file_points: tuple[str | None, ...]


def _liquid_basis(core: ValveyCore) -> tuple[float, tuple[str | None, ...]]:
    cfg = core.cfg
    return cfg.capacity.liquid_fraction, (cfg.points.heat_removed, cfg.safety.rack_power)


def _exchanger_basis(core: ValveyCore) -> tuple[str, tuple[str | None, ...]]:
    c, p = core.cfg.cdu, core.cfg.points
    where = f"serial:{c.serial_port}" if c.serial_port is not None else f"{c.host}:{c.port}"
    return f"{where}/{c.unit_id}", (p.heat_removed, p.return_temp, p.facility_supply_temp)


def _k_window(core: ValveyCore) -> tuple[float, float]:
    """`k_open_window` of the core's config: the most flow is ``pump_loop.
    flow_setpoint_max_lpm``, or ``safety.design_flow_lpm`` when larger."""
    cfg = core.cfg
    flow = max(cfg.pump_loop.flow_setpoint_max_lpm, cfg.safety.design_flow_lpm or 0.0)
    return k_open_window(cfg.capacity, cfg.supply_loop.setpoint_max_c, flow)


def _number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float)


def _names(v: Any, n: int) -> bool:
    return isinstance(v, list) and len(v) == n and all(
        x is None or (isinstance(x, str) and len(x) <= 200) for x in v)


def _liquid(v: Any) -> LearnedLiquid | None:
    """Parse ``learned.liquid_fraction`` (null: none). Raises ValueError for a wrong shape."""
    if v is None:
        return None
    if not isinstance(v, dict) or set(v) != {"value", "file_liquid_fraction", "file_inputs"} \
            or not _number(v["value"]) or not _number(v["file_liquid_fraction"]) \
            or not _names(v["file_inputs"], 2):
        raise ValueError("learned.liquid_fraction: expected {value, file_liquid_fraction: "
                         f"numbers, file_inputs: [2 names]}}, got {v!r}")
    return LearnedLiquid(float(v["value"]), float(v["file_liquid_fraction"]),
                         tuple(v["file_inputs"]))


def _exchanger(v: Any) -> LearnedExchanger | None:
    """Parse ``learned.exchanger`` (null: none). Raises ValueError for a wrong shape."""
    if v is None:
        return None
    if not isinstance(v, dict) or set(v) != {"k_open_kw_per_k", "file_cdu", "file_points"} \
            or not _number(v["k_open_kw_per_k"]) or not isinstance(v["file_cdu"], str) \
            or len(v["file_cdu"]) > 300 or not _names(v["file_points"], 3):
        raise ValueError("learned.exchanger: expected {k_open_kw_per_k: number, file_cdu: "
                         f"text, file_points: [3 names]}}, got {v!r}")
    return LearnedExchanger(float(v["k_open_kw_per_k"]), v["file_cdu"],
                            tuple(v["file_points"]))


_COMMISSIONED = ("kc_pct_per_k", "ti_s", "ff_gain", "file_kc_pct_per_k", "file_ti_s",
                 "file_ff_gain")


def _commissioned(v: Any) -> Accepted | None:
    """Parse ``learned.commissioned`` (null, or numbers; ``ti_s`` / ``file_ti_s`` may be
    null: no integral action). Raises ValueError for a wrong shape."""
    if v is None:
        return None
    if not isinstance(v, dict) or set(v) != set(_COMMISSIONED) or any(
            not (x is None and k in ("ti_s", "file_ti_s"))
            and (isinstance(x, bool) or not isinstance(x, int | float))
            for k, x in v.items()):
        raise ValueError(f"learned.commissioned: expected {{{', '.join(_COMMISSIONED)}}} "
                         f"numbers, got {v!r}")
    f = [None if v[k] is None else float(v[k]) for k in _COMMISSIONED]
    return (f[0], f[1], f[2], f[3], f[4], f[5])  # type: ignore[return-value]


_RELEARNED = {
    "valve_stroke_s": "re-learned from the valve's travel (the cold prior meanwhile)",
    "valve_rest_pct": "re-learned at rest",
    "liquid_fraction": "re-learned at steady state (capacity.liquid_fraction meanwhile)",
    "k_open_kw_per_k": "re-measured when the valve is next fully open (racky's table "
                       "meanwhile)",
}


class _AgeRule:
    """`apply_learned`'s age rule (`valvey.learned_age`): ``old(name)`` says why a value is
    not fresh (None: fresh, or no rule), ``keep`` collects the stamps of what was restored."""

    def __init__(self, core: ValveyCore, saved: LearnedState, ages: LearnedAges | None):
        self.on = ages is not None
        self.wall_s = ages.wall_s() if ages is not None else 0.0
        self.max_age_s = core.cfg.control.learned_max_age_s
        self.saved = dict(saved.confirmed_wall_s)
        self.kept: dict[str, int] = {}

    def old(self, name: str) -> str | None:
        if not self.on:
            return None
        age = age_s(self.saved.get(name), self.wall_s)
        if age is not None and age <= self.max_age_s:
            return None
        over = "" if age is None else (
            f", over control.learned_max_age_s ({self.max_age_s:.0f} s)")
        return describe_age(age) + over

    def dropped(self, name: str) -> str | None:
        """The superseded entry of a value dropped for its age (None: not dropped)."""
        why = self.old(name)
        if why is None or WHEN_OLD[kind_of(name)] != "drop":
            return None
        return f"{name}: {why}: dropped, {_RELEARNED[kind_of(name)]}"

    def restored(self, name: str) -> str:
        """The restored entry of a value laid over the core (its stamp kept when known)."""
        stamp = self.saved.get(name)
        if stamp is not None and age_s(stamp, self.wall_s) is not None:
            self.kept[name] = stamp
        why = self.old(name)
        return name if why is None else f"{name}: {why}: kept as a starting point only"


def apply_learned(core: ValveyCore, saved: LearnedState,
                  ages: LearnedAges | None = None) -> tuple[list[str], list[str]]:
    """Lay saved learned values over a freshly built core (module docstring), each only while
    it is of at most ``control.learned_max_age_s`` (`valvey.learned_age`; ``ages`` None: no
    age rule, a simulation laying its own values over a fresh core); ``ages`` then adopts the
    stamps of what was restored.

    Returns:
        (restored, superseded): names of what was restored (``name: why`` for one kept as a
        starting point only), and of what was dropped and why.
    """
    rule = _AgeRule(core, saved, ages)
    restored: list[str] = []
    superseded: list[str] = []
    strokes: dict[str, float] = {}
    for n, v in saved.valve_stroke_s:
        drop = rule.dropped(f"valve_stroke_s.{n}")
        if drop is not None:
            superseded.append(drop)
        else:
            strokes[n] = v
    got = core.valves.restore_learned(strokes)
    restored += [rule.restored(f"valve_stroke_s.{n}") for n in got]
    superseded += [f"valve_stroke_s.{n}: unknown valve or outside the bounds"
                   for n in strokes if n not in got]
    rest: dict[str, tuple[float, float]] = {}
    for n, o, b in saved.valve_rest_pct:
        drop = rule.dropped(f"valve_rest_pct.{n}")
        if drop is not None:
            superseded.append(drop)
        else:
            rest[n] = (o, b)
    got = core.valves.restore_learned_rest(rest)
    restored += [rule.restored(f"valve_rest_pct.{n}") for n in got]
    superseded += [f"valve_rest_pct.{n}: unknown valve or outside the bounds"
                   for n in rest if n not in got]
    if saved.ff_map_pct is not None:
        vm = core.ff.settings.valve_map
        if (saved.ff_map_powers_kw != tuple(float(p[0]) for p in vm)
                or saved.ff_map_prior_pct != tuple(float(p[1]) for p in vm)):
            superseded.append("ff_map_pct: feedforward.valve_map changed since")
        elif core.ff.restore_map(list(saved.ff_map_pct)):
            restored.append(rule.restored("ff_map_pct"))
        else:
            superseded.append("ff_map_pct: outside the bounds of feedforward.adapt_*")
    if saved.commissioned is not None:
        if core.commissioning.restore(core, saved.commissioned):
            restored.append(rule.restored("commissioned"))
        else:
            superseded.append("commissioned: the configured gains changed since, or outside "
                              "the commissioning bounds")
    _apply_capacity(core, saved, rule, restored, superseded)
    if ages is not None:
        ages.adopt(core, rule.kept)
    return restored, superseded


def _apply_capacity(core: ValveyCore, saved: LearnedState, rule: _AgeRule,
                    restored: list[str], superseded: list[str]) -> None:
    """`apply_learned`'s part for the capacity guard: the liquid fraction and the exchanger's
    valve-open conductance (module docstring)."""
    lf = saved.liquid_fraction
    if lf is not None:
        cap = core.cfg.capacity
        drop = rule.dropped("liquid_fraction")
        if (lf.file_liquid_fraction, lf.file_inputs) != _liquid_basis(core):
            superseded.append("liquid_fraction: capacity.liquid_fraction or its inputs "
                              "(points.heat_removed, safety.rack_power) changed since")
        elif drop is not None:
            superseded.append(drop)
        elif core.capacity.liquid.restore(lf.value):
            restored.append(rule.restored("liquid_fraction"))
        else:
            superseded.append(f"liquid_fraction: {lf.value:g} outside capacity.liquid_fraction_"
                              f"min..max [{cap.liquid_fraction_min:g}, "
                              f"{cap.liquid_fraction_max:g}], or learn_liquid_fraction off")
    ex = saved.exchanger
    if ex is not None:
        lo, hi = _k_window(core)
        drop = rule.dropped("k_open_kw_per_k")
        if (ex.file_cdu, ex.file_points) != _exchanger_basis(core):
            superseded.append("k_open_kw_per_k: the CDU (cdu.host, port, unit_id, "
                              "serial_port) or its heat, return or facility point changed since")
        elif drop is not None:
            superseded.append(drop)
        elif core.capacity.restore_k_open(ex.k_open_kw_per_k, (lo, hi)):
            restored.append(rule.restored("k_open_kw_per_k"))
        else:
            superseded.append(f"k_open_kw_per_k: {ex.k_open_kw_per_k:g} outside its "
                              f"plausibility window [{lo:.3g}, {hi:.3g}] kW/K")


def apply_command_state(
    loop: SupplyLoop, file: SupplyLoopSettings, saved: CommandState
) -> tuple[list[str], list[str]]:
    """Lay a saved command state over a loop built from (or reloaded to) ``file`` (the caller
    checked ``saved.owner``): `_lay_over` without following a return to auto (a restart
    starts in auto).

    Returns:
        (restored, superseded): the names of the values restored, and of the values the
        edited config superseded or the loop refused (``setpoint_c: out_of_range``).
    """
    return _lay_over(loop, file, saved, follow_auto=False,
                     changed_since="the config's {} changed since")


def sync_command_state(
    loop: SupplyLoop, file: SupplyLoopSettings, synced: CommandState
) -> tuple[list[str], list[str]]:
    """Lay the command state of a redundant pair's active (its sync record, issue 15) over
    the standby's loop: the rule of `apply_command_state`, but every difference is followed,
    back to the config's value and from manual back to auto included.

    Returns:
        (changed, superseded): the names of the values changed on the loop, and of those
        refused (a config that differs, a value the loop refuses).
    """
    return _lay_over(loop, file, synced, follow_auto=True,
                     changed_since="the configs' {} differ")


def _lay_over(loop: SupplyLoop, file: SupplyLoopSettings, state: CommandState, *,
              follow_auto: bool, changed_since: str) -> tuple[list[str], list[str]]:
    """The one rule of both: a setpoint or shadow flag is taken only while ``file`` still has
    the value the state was recorded against (an edited config, or a pair's two instances with
    different configs, keep their own); a manual output is taken when it differs; with
    ``follow_auto`` a state in auto puts a loop in manual back to auto."""
    changed: list[str] = []
    superseded: list[str] = []
    if loop.setpoint_c != state.setpoint_c:
        if state.file_setpoint_c != file.setpoint_c:
            superseded.append("setpoint_c: " + changed_since.format("setpoint"))
        else:
            try:
                loop.set_setpoint(state.setpoint_c)
                changed.append("setpoint_c")
            except CommandError as err:
                superseded.append(f"setpoint_c: {err.code} ({err})")
    if loop.shadow != state.shadow:
        if state.file_shadow != file.shadow:
            superseded.append("shadow: " + changed_since.format("shadow flag"))
        else:
            loop.set_shadow(state.shadow)
            changed.append("shadow")
    if state.manual_output_pct is None:
        if follow_auto and loop.manual_target_pct is not None:
            loop.set_auto()
            changed.append("auto")
    elif loop.manual_target_pct != state.manual_output_pct:
        try:
            loop.set_manual(state.manual_output_pct)
            changed.append("manual_output_pct")
        except CommandError as err:
            superseded.append(f"manual_output_pct: {err.code} ({err})")
    return changed, superseded
