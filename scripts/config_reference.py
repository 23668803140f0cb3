#!/usr/bin/env python3
"""Generate docs/CONFIG-REFERENCE.md from the daemons' config models (issue 7).

    python scripts/config_reference.py          # check: exit 1 when the file is stale
    python scripts/config_reference.py --write  # regenerate

One table per TOML section: key, type, default, allowed values (from the field constraints)
and the description. A test (tests/unit/test_service_config_reference.py) keeps the file current.
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "CONFIG-REFERENCE.md"


# Validated string types (rackplane.settings): the validator's name -> the "allowed" text.
_VALIDATED = {
    "_level": "topic level: 1-64 of A-Z a-z 0-9 _ : - (no / + # $ . spaces)",
    "check_client_id": "client id: 1-200 of A-Z a-z 0-9 _ : -",
}


def _validated(metadata: Any) -> list[str]:
    names = (getattr(getattr(m, "func", None), "__name__", "") for m in metadata)
    return [_VALIDATED[n] for n in names if n in _VALIDATED]


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(tp)[0])
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if tp is type(None):
        return "none"
    return getattr(tp, "__name__", str(tp))


def _constraints(info: FieldInfo) -> str:
    out: list[str] = _validated(info.metadata)
    for tp in typing.get_args(info.annotation):  # e.g. TopicLevel | None, dict[TopicLevel, ...]
        if typing.get_origin(tp) is typing.Annotated:
            out += _validated(tp.__metadata__)
    for m in info.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"),
                          ("min_length", "min length"), ("max_length", "max length"),
                          ("pattern", "pattern")):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{sym} {v}")
    return ", ".join(out)


def _default(value: Any) -> str:
    if value is PydanticUndefined:
        return "(required)"
    if isinstance(value, BaseModel):
        return "(section)"
    if value is None:
        return "unset"
    if isinstance(value, Path):
        return f"`{value}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, list | tuple | dict) and not value:
        return "empty"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _models_in(tp: Any) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for a in typing.get_args(tp) for m in _models_in(a)]


def section(model: type[BaseModel], instance: BaseModel | None, path: str,
            out: list[str], seen: set[str]) -> None:
    rows: list[str] = []
    nested: list[tuple[str, type[BaseModel], BaseModel | None]] = []
    for name, info in model.model_fields.items():
        value = (getattr(instance, name) if instance is not None
                 else info.get_default(call_default_factory=True) if not info.is_required()
                 else PydanticUndefined)
        if isinstance(value, BaseModel):  # a required section's: an example, not a default
            nested.append((name, type(value), None if info.is_required() else value))
            continue
        is_list = typing.get_origin(info.annotation) in (list, tuple)
        for sub in _models_in(info.annotation):  # e.g. [[power_shelves]], optional [mqtt.tls]
            nested.append((f"{name}[]" if is_list else name, sub, None))
        rows.append(f"| `{name}` | {_cell(_type_name(info.annotation))} | "
                    f"{_cell(_default(value))} | {_cell(_constraints(info))} | "
                    f"{_cell(info.description or '')} |")
    if rows:
        title = f"[{path}]" if path else "top level"
        doc = (model.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        out += [f"### `{title}`", ""]
        if doc and not doc.startswith(("Create a new model", "A base class")):
            out += [doc, ""]
        out += ["| key | type | default | allowed | description |",
                "|---|---|---|---|---|", *rows, ""]
    for name, sub, inst in nested:
        key = f"{path}.{name}" if path else name
        if key in seen:
            continue
        seen.add(key)
        section(sub, inst, key, out, seen)


def render() -> str:
    from racky.config import RackyConfig
    from rlc.config import RlcConfig
    from trayagent.config import TrayAgentConfig
    from valvey.config import ValveyConfig

    out = [
        "# Configuration reference",
        "",
        "Generated from the config models by `scripts/config_reference.py`; do not edit by hand "
        "(tests/unit/test_service_config_reference.py fails when it is stale). Commented "
        "examples with every default: `config/valvey.example.toml`, "
        "`config/racky.example.toml`, `config/tray-agent.example.toml`, "
        "`config/rlc.example.toml` (`valvey "
        "--print-default-config`). Relative paths resolve "
        "against the config file's folder, except a relative `spool.directory` under systemd, "
        "which lives in `$STATE_DIRECTORY`. Secrets never go in the file: `*_env` keys name "
        "environment variables (systemd: `EnvironmentFile=`). TOML has no null: a key whose "
        "type includes `none` is switched off (None) by the string `\"unset\"` (e.g. "
        "`heat_removed = \"unset\"` for a CDU without that point); leaving a key out keeps "
        "its default.",
        "",
    ]
    for title, model in (("valvey", ValveyConfig), ("racky", RackyConfig),
                         ("tray-agent", TrayAgentConfig), ("rlc", RlcConfig)):
        out += [f"## {title}", ""]
        hook = getattr(model, "example_values", None)  # required sections: examples
        section(model, model.model_validate(hook() if hook else {}), "", out, set())
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--write" in argv:
        OUT.write_text(text)
        print(f"wrote {OUT.relative_to(ROOT)}")
        return 0
    if not OUT.exists() or OUT.read_text() != text:
        print(f"stale: {OUT.relative_to(ROOT)} (run scripts/config_reference.py --write)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
