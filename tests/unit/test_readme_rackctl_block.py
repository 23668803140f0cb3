"""README's rackctl examples (the first ``sh`` block of "### MQTT", which
tests/integration/test_demo_talk.py runs against a demo) leave valvey as they found it: every
lease they acquire is released and a manual mode is followed by ``set_mode auto``, in order
(a new user following them left valvey in manual with the valve leased); and the text says
where ``rackctl`` is."""

from __future__ import annotations

import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _mqtt_section() -> str:
    return README.read_text().split("\n### MQTT\n", 1)[1].split("\n### ", 1)[0]


def _block_commands() -> list[list[str]]:
    block = _mqtt_section().split("```sh", 1)[1].split("```", 1)[0]
    out = []
    for line in block.splitlines():
        line = line.split("  #", 1)[0].strip()
        if line.startswith("rackctl cmd "):
            out.append(shlex.split(line)[2:])
    return out


def _args(argv: list[str]) -> dict[str, str]:
    pairs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--arg", "-a")]
    return dict(p.split("=", 1) for p in pairs)


def test_readme_examples_give_back_what_they_take() -> None:
    manual: set[str] = set()  # daemons left in manual
    leases: set[tuple[str, str]] = set()  # (daemon, output) held
    for argv in _block_commands():
        daemon, verb, args = argv[0], argv[1], _args(argv)
        if verb == "acquire_lease":
            leases.add((daemon, args["output"]))
        elif verb == "release_lease":
            assert daemon not in manual, "release the lease after set_mode auto"
            leases.discard((daemon, args["output"]))
        elif verb == "set_mode":
            (manual.add if args["mode"] == "manual" else manual.discard)(daemon)
    assert not manual, f"left in manual: {manual}"
    assert not leases, f"leases left held: {leases}"


def test_readme_says_where_rackctl_is() -> None:
    text = _mqtt_section()
    assert ".venv/bin/rackctl" in text and "source .venv/bin/activate" in text
