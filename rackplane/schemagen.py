"""The one JSON Schema generator of the project: pydantic models -> committed ``*.schema.json``
files, written or checked (``rackctl schemas --write | --check``).

Every shipped schema (``rackplane/schemas``: the command envelope, reply, payloads and each
daemon's verbs; ``sims/schemas``: the simulators' payloads) is the text of `schema_text`:
draft 2020-12, ``$id`` ``urn:rackplane:schema:<name>``, the model's ``model_json_schema()``
(a model's docstring becomes its ``description``), keys sorted, two-space indent, one final
newline. A package supplies its documents (file name -> text) and these functions write or
compare them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

__all__ = [
    "SCHEMA_DIALECT",
    "SCHEMA_SUFFIX",
    "schema_documents_of",
    "schema_text",
    "stale_documents",
    "write_documents",
]

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
"""The JSON Schema dialect of every shipped schema."""

SCHEMA_SUFFIX = ".schema.json"
"""The file-name suffix of a schema; the name before it is the ``$id``'s last part."""


def schema_text(model: type[BaseModel], file_name: str) -> str:
    """The JSON Schema file text of ``model``.

    Args:
        model: a pydantic model class (a `pydantic.RootModel` too).
        file_name: ``<name>.schema.json``; ``<name>`` becomes ``urn:rackplane:schema:<name>``.

    Returns:
        Stable text (keys sorted, UTF-8 characters kept), ending in one newline.
    """
    schema: dict[str, Any] = {
        "$schema": SCHEMA_DIALECT,
        "$id": f"urn:rackplane:schema:{file_name.removesuffix(SCHEMA_SUFFIX)}",
        **model.model_json_schema(),
    }
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def schema_documents_of(models: Mapping[str, type[BaseModel]]) -> dict[str, str]:
    """``{<name>.schema.json: text}`` of ``{<name>: model}``, in the mapping's order."""
    return {f"{name}{SCHEMA_SUFFIX}": schema_text(model, f"{name}{SCHEMA_SUFFIX}")
            for name, model in models.items()}


def _differs(path: Path, text: str) -> bool:
    return not path.exists() or path.read_text(encoding="utf-8") != text


def write_documents(
    directory: str | Path, docs: Mapping[str, str], *, prune: bool = False
) -> list[Path]:
    """Write the files of ``docs`` (file name -> text) that are missing from ``directory`` or
    differ; with ``prune``, also remove the ``*.schema.json`` files ``docs`` does not name.

    Returns:
        The paths written or removed, in that order.

    Raises:
        OSError: the folder cannot be created or a file written.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, text in docs.items():
        p = d / name
        if _differs(p, text):
            p.write_text(text, encoding="utf-8")
            changed.append(p)
    if prune:
        for p in sorted(d.glob(f"*{SCHEMA_SUFFIX}")):
            if p.name not in docs:
                p.unlink()
                changed.append(p)
    return changed


def stale_documents(
    directory: str | Path, docs: Mapping[str, str], *, complete: bool = False
) -> list[str]:
    """Names of the files of ``docs`` missing from ``directory`` or differing from it; with
    ``complete``, also the ``*.schema.json`` files there that ``docs`` does not name (a model
    removed or renamed)."""
    d = Path(directory)
    out = [name for name, text in docs.items() if _differs(d / name, text)]
    if complete:
        out += [p.name for p in sorted(d.glob(f"*{SCHEMA_SUFFIX}")) if p.name not in docs]
    return out
