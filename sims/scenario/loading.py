"""Finding and loading scenarios: the bundled folder, by name or by path."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from rackplane.config import read_toml, validate_data
from rackplane.errors import ConfigError
from sims.scenario.models import Scenario

__all__ = ["list_scenarios", "load_scenario", "scenario_dir"]


def scenario_dir() -> Path:
    """Folder of the bundled scenarios (``config/scenarios``)."""
    return Path(str(files("rackplane_config") / "scenarios"))


def list_scenarios() -> list[Scenario]:
    """Every bundled scenario, sorted by name."""
    return sorted((load_scenario(p) for p in scenario_dir().glob("*.toml")), key=lambda s: s.name)


def load_scenario(ref: str | Path) -> Scenario:
    """Load a scenario by bundled name (``load-step``) or by path.

    Raises:
        ConfigError: unknown name, unreadable file, or invalid content (key path named).
    """
    p = Path(ref)
    if p.suffix != ".toml" and len(p.parts) == 1:
        p = scenario_dir() / f"{ref}.toml"
        if not p.exists():
            known = ", ".join(sorted(q.stem for q in scenario_dir().glob("*.toml")))
            raise ConfigError(f"unknown scenario {ref!r}; bundled scenarios: {known}")
    return validate_data(Scenario, read_toml(p), str(p), base_dir=p.parent)
