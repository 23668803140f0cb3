"""docs/CONFIG-REFERENCE.md is what scripts/config_reference.py generates from the config models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_config_reference_is_current() -> None:
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "config_reference.py")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_config_reference_names_every_section() -> None:
    from pydantic import BaseModel

    from racky.config import RackyConfig
    from valvey.config import ValveyConfig

    text = (ROOT / "docs" / "CONFIG-REFERENCE.md").read_text()
    for model in (ValveyConfig, RackyConfig):
        for name, value in model().__dict__.items():
            if isinstance(value, BaseModel):  # a section, or a table of sub-sections
                assert f"### `[{name}]`" in text or f"### `[{name}." in text, name
