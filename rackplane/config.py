"""Config loading: TOML into validated pydantic models; every error names its key path.

Usage::

    cfg = load_config(ValveyConfig, path)        # raises ConfigError
    cfg = load_config(ValveyConfig, None)        # embedded defaults

Rules (DESIGN §3): units in field names, limits checked across fields by model validators,
unknown keys are errors (typos must not silently fall back to defaults), secrets only from the
environment (`SecretFromEnv`).
"""

from __future__ import annotations

import math
import os
import tomllib
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from rackplane.config_errors import ProblemList, format_validation_error
from rackplane.errors import ConfigError
from rackplane.paths import is_in_state_directory

__all__ = [
    "EXAMPLE_VALUES_HOOK",
    "REQUIRED_CHECKED",
    "UNSET",
    "M",
    "RequiredCheck",
    "StrictModel",
    "check_environment",
    "check_state_file_dir",
    "check_writable_dir",
    "example_toml",
    "format_validation_error",
    "identity_required",
    "load_config",
    "read_toml",
    "require_keys",
    "secret_from_env",
    "toml_value",
    "validate_data",
]


def _toml_type(value: Any) -> str:
    """The TOML name of ``value``'s type (what the file holds), for error messages."""
    for t, name in ((bool, "boolean"), (str, "string"), (int, "integer"), (float, "float"),
                    (list, "array"), (dict, "table")):
        if isinstance(value, t):
            return name
    return type(value).__name__


def _strict_problem(annotation: Any, value: Any) -> str | None:
    """Why ``value`` may not fill a field typed ``annotation`` (None: no objection).

    TOML has real types, so no coercion is needed: a bool is never a number, a string is never
    a number or a bool (``budget_w = true`` must not become 1 W). An int is fine for a float.
    Looks into Optional/Union, Annotated, list[...] and tuple[...]; other types pass through.
    """
    origin = get_origin(annotation)
    if origin is Annotated:
        return _strict_problem(get_args(annotation)[0], value)
    if origin is Union or origin is types.UnionType:
        members = [a for a in get_args(annotation) if a is not type(None)]
        if value is None or not members:
            return None
        problems = [_strict_problem(a, value) for a in members]
        return None if any(p is None for p in problems) else problems[0]
    if origin in (list, tuple) and isinstance(value, list | tuple):
        args = [a for a in get_args(annotation) if a is not Ellipsis]
        for i, item in enumerate(value):
            if not args:
                break
            arg = args[min(i, len(args) - 1)]
            problem = _strict_problem(arg, item)
            if problem:
                return f"item {i}: {problem}"
        return None
    if annotation is bool and not isinstance(value, bool):
        return f"must be a boolean (true/false), not a {_toml_type(value)}"
    if annotation in (int, float) and isinstance(value, bool | str):
        return f"must be a number, not a {_toml_type(value)}"
    if annotation is float and isinstance(value, float) and not math.isfinite(value):
        # TOML has inf and nan: a delay of inf disables what it delays, a nan compares false
        return "must be a finite number"
    return None


UNSET = "unset"
"""TOML has no null: an optional key (one whose default or type admits None) written as this
string is None, i.e. switched off (e.g. ``[points] flow = "unset"`` for a CDU without a flow
meter). Leaving the key out keeps its default."""


def _admits_none(annotation: Any) -> bool:
    origin = get_origin(annotation)
    if origin is Annotated:
        return _admits_none(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return type(None) in get_args(annotation)
    return annotation is None or annotation is type(None)


class StrictModel(BaseModel):
    """Base for every config model: unknown keys are errors, instances are immutable.

    Scalars are type-strict (`_strict_problem`): a TOML bool or string never becomes a number,
    a string never becomes a bool, a float field is never inf or nan (TOML has both). An
    optional field set to `UNSET` (``"unset"``) is None.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_coercion(cls, v: Any, info: ValidationInfo) -> Any:
        if cls.model_config.get("strict"):
            return v  # pydantic's own strict mode already refuses these (command args)
        field = cls.model_fields.get(info.field_name or "")
        if field is not None:
            if v == UNSET:
                if _admits_none(field.annotation):
                    return None
                raise ValueError("switches off optional keys only; this key is "
                                 "required: give it a value")
            problem = _strict_problem(field.annotation, v)
            if problem:
                raise ValueError(problem)
        return v


M = TypeVar("M", bound=BaseModel)


def validate_data(
    model: type[M],
    data: dict[str, Any],
    source: str = "<config>",
    base_dir: str | os.PathLike[str] | None = None,
) -> M:
    """Validate a mapping into ``model``; raises `ConfigError` listing every key path.

    ``base_dir`` is where relative paths in the config resolve (the config file's folder).
    """
    try:
        return model.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as err:
        problems = format_validation_error(err, source, model)
        raise ConfigError(
            f"invalid configuration in {source}:\n  " + "\n  ".join(problems),
            path=source,
            problems=problems,
        ) from None


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a TOML file; raises `ConfigError` with the file name and the parser's position."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {p}", path=str(p)) from None
    except PermissionError:
        raise ConfigError(f"config file not readable: {p}", path=str(p)) from None
    except IsADirectoryError:
        raise ConfigError(f"config path is a directory, not a file: {p}", path=str(p)) from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{p}: not UTF-8 text ({err.reason} at byte {err.start})",
                          path=str(p)) from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{p}: not valid TOML: {err}", path=str(p)) from None


RequiredCheck = Callable[[Mapping[str, Any]], list[str]]
"""What a daemon cannot run without, judged on the config file's own keys (never on the
models' defaults): raw TOML mapping -> problems (``<key path>: why``; empty: all there)."""

REQUIRED_CHECKED = "required_checked"
"""Validation context key (`load_config`): true when a `RequiredCheck` judged the file, so a
model's own check of the same (a ``mode="before"`` validator, which would stop every other
error being reported) may leave it to that check."""


def _has(data: Mapping[str, Any], path: str) -> bool:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def require_keys(data: Mapping[str, Any], keys: Mapping[str, str]) -> list[str]:
    """``<key path>: <why>`` for each of ``keys`` (dotted path -> why it is needed) that the
    file itself does not set (a model default does not count)."""
    return [f"{k}: not set: {why}" for k, why in keys.items() if not _has(data, k)]


def identity_required(daemon: str) -> dict[str, str]:
    """The ``[identity]`` keys every rack daemon's file must set (`require_keys`): the
    defaults (site lab, rack rack1) would put it on another rack's topics."""
    return {"identity.site": f"the site this {daemon} runs in (topics and time series "
                             "carry it; the default 'lab' is an example)",
            "identity.rack": f"the rack this {daemon} runs for (the default 'rack1' is an "
                             "example: two racks on it would share topics)"}


def load_config(model: type[M], path: str | os.PathLike[str] | None,
                required: RequiredCheck | None = None, example: str | None = None,
                problems: ProblemList | None = None) -> M:
    """Load ``path`` (TOML) into ``model``; ``None`` gives the embedded defaults.

    ``required`` (`RequiredCheck`) judges the file's own keys: what a daemon cannot do its job
    without (its identity, its inputs) must be written, not taken from a default; ``example``
    (a path such as ``config/racky.example.toml``) is named in the error. Every problem comes
    in one error, one line each, sorted by key path (`rackplane.config_errors`): the missing
    parts with the schema's errors (types, ranges, unknown keys, the models' checks). While
    the schema has errors, the checks that need a valid model (those across sections, a
    daemon's checks of a loaded config) cannot run: the error's last line says so.

    ``problems`` (a daemon's loader, which checks the loaded config further): when the model
    validates, the missing parts are added to it (and its ``source`` and ``example`` set) and
    the model returned; the loader raises them with its own (`ProblemList.raise_if_any`).

    Raises:
        ConfigError: file missing or unreadable, invalid TOML, a required part missing, or any
            validation failure.
    """
    data = {} if path is None else read_toml(path)
    source = "<embedded defaults>" if path is None else str(path)
    base_dir = None if path is None else Path(path).parent
    missing = required(data) if required is not None else []
    context = {"base_dir": base_dir, REQUIRED_CHECKED: required is not None}
    try:
        cfg = model.model_validate(data, context=context)
    except ValidationError as err:
        explained = [m.split(": ", 1)[0] for m in missing]
        invalid = [p.removeprefix(f"{source}: ")
                   for p in format_validation_error(err, source, model, explained)]
        across = "" if any(e["loc"] == () for e in err.errors()) else \
            "the checks across sections, "
        note = (f"(not checked until the errors above are fixed: {across}the daemon's checks "
                "of the loaded config, e.g. register maps, environment variables, folders)")
        ProblemList(source, example, missing + invalid).raise_if_any(note)
        raise  # not reached: raise_if_any raised
    out = problems if problems is not None else ProblemList()
    out.source, out.example = source, example
    out.lines += missing
    if problems is None:
        out.raise_if_any()
    return cfg


def check_environment(checks: dict[str, str | None]) -> None:
    """Every env var named in config must be set: ``{key path: var name}``.

    Raises:
        ConfigError: naming each key path whose variable is unset.
    """
    problems = [
        f"{key}: environment variable {var} is not set"
        for key, var in checks.items()
        if var and var not in os.environ
    ]
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems),
                          problems=problems)


def check_writable_dir(key: str, path: Path) -> None:
    """``path`` is, or can be created as, a writable directory (checked without creating it).

    Raises:
        ConfigError: naming ``key`` when the path is a file, under a file, or not writable.
    """
    p = Path(path).absolute()
    probe = p
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    problem = None
    if probe.exists() and not probe.is_dir():
        problem = f"{probe} is a file, not a directory"
    elif probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        problem = f"{probe} is not writable by this user"
    if problem:
        msg = f"{key}: {p} cannot be used: {problem}"
        raise ConfigError(f"invalid configuration:\n  {msg}", problems=[msg])


def secret_from_env(var: str | None) -> str | None:
    """The value of environment variable ``var`` (secrets never live in config files).

    Raises:
        ConfigError: ``var`` is named but not set.
    """
    if not var:
        return None
    value = os.environ.get(var)
    if value is None:
        raise ConfigError(f"environment variable {var} (named in config) is not set")
    return value


def toml_value(v: Any) -> str | None:
    """TOML for a default value; None when TOML cannot express it (null)."""
    import json
    from enum import Enum

    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Enum):
        v = v.value
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, Path | str):
        return json.dumps(str(v))
    if isinstance(v, list | tuple):
        items = [toml_value(x) for x in v]
        return None if any(i is None for i in items) else "[" + ", ".join(items) + "]"  # type: ignore[arg-type]
    if isinstance(v, BaseModel):  # a model inside a table (e.g. a plausibility window)
        # a field left None is omitted (TOML has no null): it loads back as its default,
        # None wherever a model allows None (tests/unit/test_config_examples.py loads back)
        v = v.model_dump(exclude_none=True)
    if isinstance(v, dict):
        parts = [(k, toml_value(x)) for k, x in v.items()]
        if any(r is None for _, r in parts):
            return None
        return "{" + ", ".join(f"{json.dumps(str(k))} = {r}" for k, r in parts) + "}"
    return json.dumps(str(v))


EXAMPLE_VALUES_HOOK = "example_values"
"""A config model with required top-level sections (no default: e.g. rlc's ``[topology]``), or
with sections whose defaults leave out what the daemon needs (a tray agent's trays), defines a
classmethod of this name returning ``{section: example value}``; `example_toml` writes a
required section commented out, another uncommented, each marked as an example to replace."""


def example_toml(model: type[BaseModel], title: str) -> str:
    """A commented TOML file with every key of ``model``, its default and its description.

    Keys whose default is None are written commented out. A required top-level section (no
    default) is written commented out from the model's example values (`EXAMPLE_VALUES_HOOK`),
    under a line saying it is required and an example only: the file does not load until the
    operator writes their own. Generated from the models, so the shipped examples cannot drift
    from the code (a test compares them).
    """
    out = [f"# {title}", "# Generated from the config models: every key with its default.", ""]
    hook = getattr(model, EXAMPLE_VALUES_HOOK, None)
    examples: dict[str, Any] = hook() if hook is not None else {}
    instance = model.model_validate(examples)
    required = [n for n, info in model.model_fields.items() if info.is_required()]

    def walk(m: BaseModel, prefix: str) -> None:
        scalars: list[str] = []
        nested: list[tuple[str, BaseModel]] = []
        for name, info in type(m).model_fields.items():
            value = getattr(m, name)
            if isinstance(value, BaseModel):
                nested.append((name, value))
                continue
            desc = (info.description or "").replace("\n", " ")
            rendered = toml_value(value)
            if desc:
                scalars.append(f"# {desc}")
            if rendered is None:
                scalars.append(f"# {name} = (unset)")
            else:
                scalars.append(f"{name} = {rendered}")
        if scalars and prefix:
            out.append(f"[{prefix}]")
        out.extend(scalars)
        if scalars:
            out.append("")
        for name, sub in nested:
            if not prefix and name in required:
                continue  # written last, commented out (an example)
            if not prefix and name in examples:
                out.append(f"# [{name}] holds EXAMPLE values where the defaults have none the "
                           "daemon can run on: replace them with your own")
            walk(sub, f"{prefix}.{name}" if prefix else name)

    walk(instance, "")
    for name in required:
        sub = getattr(instance, name)
        if not isinstance(sub, BaseModel):
            continue
        desc = (type(instance).model_fields[name].description or "").replace("\n", " ")
        out.append(f"# [{name}] is REQUIRED (no default{': ' + desc if desc else ''}). What "
                   "follows is an EXAMPLE only:")
        out.append("# uncomment it and replace every value with your own; the daemon refuses "
                   "a config without it.")
        start = len(out)
        walk(sub, name)
        out[start:] = [f"# {line}" if line else "" for line in out[start:]]
    return "\n".join(out).rstrip() + "\n"


def check_state_file_dir(key: str, path: Path, environ: dict[str, str] | None = None) -> None:
    """The folder of state file ``path`` exists and is writable (it is never created, except
    inside systemd's ``$STATE_DIRECTORY``, which systemd itself creates).

    Raises:
        ConfigError: naming ``key`` when the folder is missing, a file, or not writable.
    """
    parent = Path(path).absolute().parent
    if is_in_state_directory(parent, environ):
        check_writable_dir(key, parent)
        return
    problem = None
    if not parent.exists():
        problem = f"folder {parent} does not exist (create it, or use a path in an existing one)"
    elif not parent.is_dir():
        problem = f"{parent} is a file, not a directory"
    elif not os.access(parent, os.W_OK | os.X_OK):
        problem = f"folder {parent} is not writable by this user"
    if problem:
        msg = f"{key}: {path} cannot be used: {problem}"
        raise ConfigError(f"invalid configuration:\n  {msg}", problems=[msg])
