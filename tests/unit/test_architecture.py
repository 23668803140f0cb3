"""The architecture's rules, enforced on the source (DESIGN §1 and §2).

- Each external library is imported by exactly one adapter module.
- rackplane imports none of valvey, racky, sims; valvey and racky never import each other;
  the daemons never import sims.
- Pure cores import no adapter and no I/O library.
- No line protocol built by string formatting (FIELD-CASES BR-21).
- Every package folder is listed in pyproject's explicit package list.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rackplane", "valvey", "racky", "sims", "rackctl")


def _modules() -> dict[str, set[str]]:
    """module path (relative) -> set of top-level-qualified imported module names."""
    out: dict[str, set[str]] = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            tree = ast.parse(f.read_text(), str(f))
            names: set[str] = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names.add(node.module)
            out[str(f.relative_to(ROOT))] = names
    return out


MODULES = _modules()


def _importers(prefix: str) -> set[str]:
    return {m for m, names in MODULES.items()
            if any(n == prefix or n.startswith(prefix + ".") for n in names)}


@pytest.mark.parametrize(("library", "allowed"), [
    ("aiomqtt", {"rackplane/mqtt.py"}),
    ("paho", {"rackplane/mqtt.py"}),
    ("pymodbus", {"rackplane/modbus.py", "sims/modbus_face.py"}),
    ("influxdb_client", {"rackplane/tsdb.py"}),
    ("simple_pid", {"rackplane/pid.py"}),
    ("prometheus_client", {"rackplane/selfmetrics.py"}),
    ("serial", {"rackplane/modbus.py"}),
    ("msgspec", {"rackplane/tray_contract.py"}),
    ("orjson", set()),  # replaced by msgspec (one library for one job)
])
def test_each_library_has_one_adapter(library: str, allowed: set[str]) -> None:
    assert _importers(library) <= allowed


def test_dependency_rules() -> None:
    for mod, names in MODULES.items():
        top = {n.split(".")[0] for n in names}
        if mod.startswith("rackplane/"):
            assert not top & {"valvey", "racky", "sims", "rackctl"}, mod
        if mod.startswith("valvey/"):
            assert not top & {"racky", "sims", "rackctl"}, mod
        if mod.startswith("racky/"):
            assert not top & {"valvey", "sims", "rackctl"}, mod
        if mod.startswith("sims/"):
            assert not top & {"valvey", "racky", "rackctl"}, mod


PURE = [
    "rackplane/samples.py", "rackplane/registers.py", "rackplane/pid.py", "rackplane/alarms.py",
    "rackplane/spool.py", "valvey/supply_loop.py", "valvey/core.py", "sims/cdu.py",
    "sims/loads.py", "sims/sensors.py", "sims/scenario.py", "sims/metrics.py",
    "sims/rack.py", "sims/power.py", "sims/environment.py", "sims/workloads.py", "sims/row.py",
    "sims/fabric.py", "sims/link_harness.py",
]
IO = {"asyncio", "socket", "aiomqtt", "paho", "pymodbus", "influxdb_client", "urllib",
      "http", "rackplane.mqtt", "rackplane.modbus", "rackplane.tsdb", "rackplane.service"}


@pytest.mark.parametrize("module", PURE)
def test_pure_cores_do_no_io(module: str) -> None:
    names = MODULES[module]
    bad = {n for n in names if n in IO or n.split(".")[0] in IO}
    if module == "rackplane/spool.py":  # the spool is file I/O by nature, but never network
        bad -= set()
    assert not bad, f"{module} imports {bad}"
    src = (ROOT / module).read_text()
    for call in ("time.time(", "time.monotonic(", "datetime.now(", "asyncio.sleep("):
        assert call not in src, f"{module} reads a clock or sleeps: {call}"


def test_no_hand_built_line_protocol() -> None:
    """BR-21: tags escaped by the library only; no f-string/format building `m,tag=v f=x`."""
    import re

    pattern = re.compile(r"""f["'][a-z_]+,\{?[a-z_]+\}?=\{""")
    offenders = []
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            for i, line in enumerate(f.read_text().splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not offenders, offenders


def test_every_package_folder_is_packaged() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = set()
    for pkg in PACKAGES:
        for init in (ROOT / pkg).rglob("__init__.py"):
            found.add(".".join(init.parent.relative_to(ROOT).parts))
    assert found <= listed, f"add to pyproject [tool.setuptools] packages: {found - listed}"
