"""The shipped example configs as an operator uses them (shared by the config tests)."""

from __future__ import annotations

from pathlib import Path

CONFIG = Path(__file__).resolve().parents[2] / "config"
_REQUIRED_HEAD = "is REQUIRED (no default"


def uncomment_required(text: str) -> str:
    """``text`` (a generated example) with its required sections' examples uncommented (what
    an operator does after writing their own values)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _REQUIRED_HEAD in line), len(lines))
    out = lines[:start]
    for line in lines[start:]:
        if _REQUIRED_HEAD in line or line.startswith("# uncomment it"):
            continue
        out.append(line[2:] if line.startswith("# ") else line)
    return "\n".join(out) + "\n"


def rlc_example_text() -> str:
    """config/rlc.example.toml with its example ``[topology]`` uncommented: a config that
    names its topology (the example's: site lab, hall1/row1, racks rack1 and rack2)."""
    return uncomment_required((CONFIG / "rlc.example.toml").read_text())
