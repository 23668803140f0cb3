"""Config error lines: one per problem, ``<source>: <key path>: <problem> (got <value>)``.

Every problem a file has is reported in one go (`rackplane.config.load_config`): pydantic's
errors (types, ranges, unknown keys, the models' own checks) and what a daemon cannot run
without (`rackplane.config.RequiredCheck`), sorted by key path, so a new user fixes a file in
one pass instead of one layer per try. `ProblemList` gathers the checks a daemon runs on a
loaded config (register maps, environment variables, folders) the same way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel, ValidationError

from rackplane.errors import ConfigError

__all__ = [
    "ROOT_SECTION",
    "ProblemList",
    "format_validation_error",
    "problem_sort_key",
]

ROOT_SECTION = "config"
"""The key path of a check of the whole config that names no section of it."""

_RANGE_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than",
                           "less_than_equal"})
_MSG_PREFIXES = ("Value error, ", "Assertion failed, ")
"""What pydantic puts before a validator's own message (ValueError, assert)."""
_LEADING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TABLE_NAME = re.compile(r"\[\[?([A-Za-z_][A-Za-z0-9_]*)[\].]")


def _field_range(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> str | None:
    """The allowed range of the field at ``loc`` in ``model`` (nested models followed), as
    ``[lo, hi]`` with ``(`` / ``)`` for open ends and ∞ for none; None when it has no bounds
    or ``loc`` is not a field path."""
    m: Any = model
    info = None
    for part in loc:
        if not (isinstance(m, type) and issubclass(m, BaseModel)) or not isinstance(part, str):
            return None
        info = m.model_fields.get(part)
        if info is None:
            return None
        m = info.annotation
    if info is None:
        return None
    lo, hi, lo_open, hi_open = -math.inf, math.inf, True, True
    for c in info.metadata:
        for attr, is_lo, is_open in (("ge", True, False), ("gt", True, True),
                                     ("le", False, False), ("lt", False, True)):
            v = getattr(c, attr, None)
            if isinstance(v, int | float):
                if is_lo:
                    lo, lo_open = float(v), is_open
                else:
                    hi, hi_open = float(v), is_open
    if lo == -math.inf and hi == math.inf:
        return None

    def num(x: float) -> str:
        return "∞" if x == math.inf else "-∞" if x == -math.inf else f"{x:g}"
    return f"{'(' if lo_open else '['}{num(lo)}, {num(hi)}{')' if hi_open else ']'}"


def _message(raw: str) -> str:
    """A validator's own message without pydantic's ``Value error, `` (a ValueError) or
    ``Assertion failed, `` (an assert) before it."""
    for prefix in _MSG_PREFIXES:
        if raw.startswith(prefix):
            return raw[len(prefix):]
    return raw


def _root_section(model: type[BaseModel] | None, msg: str) -> str:
    """The key path of a check of the whole model (pydantic's ``<root>``): the section its
    message starts with (``cdu.timeout_s must be shorter ...`` -> ``cdu``), else the first
    ``[section]`` it names (``there is no [topology] section`` -> ``topology``), when that is
    one of ``model``'s fields; else `ROOT_SECTION`."""
    if model is None:
        return ROOT_SECTION
    m = _LEADING_NAME.match(msg)
    names = [m.group(0)] if m is not None else []
    names += _TABLE_NAME.findall(msg)
    return next((n for n in names if n in model.model_fields), ROOT_SECTION)


def format_validation_error(err: ValidationError, source: str,
                            model: type[BaseModel] | None = None,
                            explained: Collection[str] = ()) -> list[str]:
    """One line per problem: ``<source>: <key.path[3].sub>: <problem> (got <value>)``, the
    value stated once (not after a message that quotes the text itself; a table or an array
    is not shown); a value outside its bounds also
    names the field's whole range (``got 50, allowed [0, 20]``) when ``model`` is given. A
    validator's message comes without pydantic's ``Value error, `` prefix; a check of the
    whole model is put under the section its message names first, else ``config``
    (`ROOT_SECTION`), never ``<root>``. Sorted by key path (`problem_sort_key`).
    ``explained``: key paths already reported missing (`rackplane.config.RequiredCheck`):
    pydantic's ``Field required`` at or under them is left out (said once)."""
    lines = []
    for e in err.errors():
        msg = _message(e["msg"])
        loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in e["loc"])
        loc = loc.replace(".[", "[")
        if e["type"] == "missing" and any(loc == k or loc.startswith((f"{k}.", f"{k}["))
                                          for k in explained):
            continue
        loc = loc or _root_section(model, msg)
        got = e.get("input")
        shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
        if isinstance(got, str) and repr(got) in msg:
            shown = ""  # the validator's message names the text already: once is enough
        elif shown and e["type"] in _RANGE_ERRORS:
            allowed = _field_range(model, tuple(e["loc"]))
            if allowed is not None:
                shown = f" (got {got!r}, allowed {allowed})"
        lines.append(f"{source}: {loc}: {msg}{shown}")
    return sorted(lines, key=lambda line: problem_sort_key(line, source))


def problem_sort_key(line: str, source: str | None = None) -> tuple[Any, ...]:
    """Order problem lines by key path (``<source>: `` before it ignored): section names
    alphabetically, list indices by number (``trays[2]`` before ``trays[10]``)."""
    if source is not None and line.startswith(f"{source}: "):
        line = line[len(source) + 2:]
    path = line.split(": ", 1)[0]
    parts = [(0, int(p), "") if p.isdigit() else (1, 0, p)
             for p in re.split(r"[.\[\]]+", path) if p]
    return (*parts, (2, 0, line))


class ProblemList:
    """Gathers every problem of a config, so that all are reported at once (one
    `ConfigError`, one line each, sorted by key path): ``with problems.check():
    check_writable_dir(...)`` keeps what a check raises and goes on.

    Args:
        source: the config file (named in the error's first line).
        example: the example config (named there too).
        lines: problems so far, ``<key path>: <why>``.
    """

    def __init__(self, source: str | None = None, example: str | None = None,
                 lines: list[str] | None = None) -> None:
        self.source = source
        self.example = example
        self.lines: list[str] = list(lines or [])

    def add(self, line: str) -> None:
        """One problem, ``<key path>: <why>``."""
        self.lines.append(line)

    @contextmanager
    def check(self, key: str | None = None) -> Iterator[None]:
        """Run the block; a `ConfigError` it raises is kept: its problems, or its whole text
        after ``<key>: `` when ``key`` is given (e.g. a register map's own errors)."""
        try:
            yield
        except ConfigError as err:
            self.lines += [f"{key}: {err}"] if key is not None else err.problems or [str(err)]

    def raise_if_any(self, note: str | None = None) -> None:
        """Raise every problem gathered in one `ConfigError`: ``invalid configuration in
        <source> (every key with an example: <example>):``, then each problem on its own line
        sorted by key path (`problem_sort_key`), then ``note`` (what could not be checked).

        Raises:
            ConfigError: when any problem was gathered (``problems``: the sorted lines).
        """
        if not self.lines:
            return
        lines = sorted(self.lines, key=problem_sort_key)
        head = "invalid configuration"
        if self.source:
            head += f" in {self.source}"
        if self.example:
            head += f" (every key with an example: {self.example})"
        msg = f"{head}:\n  " + "\n  ".join(lines) + (f"\n{note}" if note else "")
        raise ConfigError(msg, path=self.source, problems=lines)
