"""Every ``--help`` of the daemons, rackctl and rack-sim, every subcommand, at three terminal
widths: plain text that says what the code's docstrings meant for the user, whole:

- no reference a user cannot follow ("(module docstring)") and no reStructuredText markup
  (````cmd````) or markup escapes (``\\[fleet]``);
- no text lost to markup: every character of a command's help (up to ``\\f``) and of each
  option's help is in the output (``default: [log] level`` lost ``[log]`` to rich markup);
- no sentence cut by a line break: a paragraph line ends only where its next word would not
  have fit (a docstring's own line breaks showed in the help);
- a command list's one-line summaries are whole (not cut with "...")."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import rackctl.fleet  # registers `rackctl fleet`
import rackctl.pair  # noqa: F401  (registers `rackctl pair`, `rackctl handover`)
from rackctl.cli import app as rackctl_app
from racky.cli import app as racky_app
from rlc.cli import app as rlc_app
from sims.cli import app as sims_app
from trayagent.cli import app as trayagent_app
from valvey.cli import app as valvey_app

APPS = {"valvey": valvey_app, "racky": racky_app, "rlc": rlc_app, "tray-agent": trayagent_app,
        "rackctl": rackctl_app, "rack-sim": sims_app}
WIDTHS = (60, 80, 120)


def _commands(cmd: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every (path, command) of a typer app's click command (typer's own click: a group has
    ``commands``)."""
    yield path, cmd
    if getattr(cmd, "commands", None):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))


def _cases() -> list[tuple[str, tuple[str, ...]]]:
    return [(name, path) for name, app in APPS.items()
            for path, _cmd in _commands(typer.main.get_command(app))]


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _help_texts(cmd: Any) -> list[str]:
    texts = [(cmd.help or "").partition("\f")[0]]
    texts += [p.help for p in cmd.params if getattr(p, "help", None)]
    return [t for t in texts if t.strip()]


def _blocks(lines: list[str]) -> Iterator[tuple[str, str]]:
    """Consecutive lines of one wrapped text: same indentation, neither blank, the second not
    the start of a row of a definition list (an argument, option or command)."""
    section = ""
    for a, b in itertools.pairwise(lines):
        if a and not a[0].isspace():
            section = a
        if not a.strip() or not b.strip():
            continue
        ind_a = len(a) - len(a.lstrip())
        ind_b = len(b) - len(b.lstrip())
        row_start = section in ("Arguments:", "Options:", "Commands:") and ind_b <= 2
        if ind_a == ind_b and not row_start:
            yield a, b


@pytest.mark.parametrize(("program", "path"), _cases(),
                         ids=lambda v: " ".join(v) if isinstance(v, tuple) else v)
def test_help_is_whole_and_plain(program: str, path: tuple[str, ...]) -> None:
    app = APPS[program]
    cmd: Any = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    for width in WIDTHS:
        r = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(width)})
        assert r.exit_code == 0, r.output
        out = r.output
        where = f"{program} {' '.join(path)} --help at {width} columns:\n{out}"
        assert "module docstring" not in out.lower(), where
        assert "``" not in out and "\\[" not in out, where
        for text in _help_texts(cmd):
            assert _squash(text) in _squash(out), f"lost text of {text!r}: {where}"
        lines = out.splitlines()
        room = max(len(line) for line in lines)
        for a, b in _blocks(lines):
            nxt = b.split()[0]
            assert len(a.rstrip()) + 1 + len(nxt) > room, f"cut before {nxt!r}: {a!r}\n{where}"
        if getattr(cmd, "commands", None) and width >= 80:
            listed = out.partition("Commands:")[2]
            assert listed and "..." not in listed, where


def test_rackctl_into_a_closed_pipe_ends_quietly_with_141() -> None:
    """``rackctl --help | head -0``: any verb whose reader has left ends with 141 (128 +
    SIGPIPE, as coreutils do) and nothing on stderr (click's own handling exited 1)."""
    import os
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "rackctl", "--help"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "COLUMNS": "200"})
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert err == ""
