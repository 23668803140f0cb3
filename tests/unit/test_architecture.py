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
PACKAGES = ("rackplane", "valvey", "racky", "sims", "harness", "rackctl", "trayagent",
            "rlc")


def _imports(nodes: list[ast.stmt] | list[ast.AST]) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Import):
                names.update(a.name for a in sub.names)
            elif isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                names.add(sub.module)
    return names


def _modules() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """module path (relative) -> imported module names; and the same for the imports made
    only inside a function body (lazy imports)."""
    out: dict[str, set[str]] = {}
    lazy: dict[str, set[str]] = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            tree = ast.parse(f.read_text(), str(f))
            rel = str(f.relative_to(ROOT))
            out[rel] = _imports([tree])
            top = _imports([n for n in tree.body
                            if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef
                                              | ast.ClassDef)])
            for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
                top |= _imports([n for n in cls.body
                                 if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)])
            lazy[rel] = out[rel] - top
    return out, lazy


MODULES, LAZY = _modules()


def _importers(prefix: str) -> set[str]:
    return {m for m, names in MODULES.items()
            if any(n == prefix or n.startswith(prefix + ".") for n in names)}


@pytest.mark.parametrize(("library", "allowed"), [
    ("aiomqtt", {"rackplane/io/mqtt/link.py", "harness/benchkids/bare_sub.py"}),
    ("paho", {"rackplane/io/mqtt/link.py", "harness/benchkids/loadgen.py"}),
    ("pymodbus", {"rackplane/io/modbus/client.py", "sims/modbus_face.py",
                  "harness/benchkids/modbus_poll.py"}),
    ("influxdb_client", {"rackplane/io/tsdb/influx.py", "harness/benchkids/tsdb_write.py"}),
    ("simple_pid", {"rackplane/core/pid.py"}),
    ("prometheus_client", {"rackplane/io/selfmetrics.py", "trayagent/dcgm.py"}),
    ("serial", {"rackplane/io/modbus/client.py"}),
    ("msgspec", {"rackplane/core/tray_contract.py"}),
    ("pynvml", {"trayagent/nvml.py"}),
    ("redfish", {"trayagent/redfish.py"}),
    ("nats", {"rackplane/io/nats/kv.py"}),
    ("orjson", set()),  # replaced by msgspec (one library for one job)
])
def test_each_library_has_one_adapter(library: str, allowed: set[str]) -> None:
    assert _importers(library) <= allowed


def test_command_router_is_independent_of_the_mqtt_adapter() -> None:
    """The command path (rackplane/commands/) reaches the broker only through its
    `CommandTransport`: it imports no adapter and no MQTT library."""
    bad = {m: sorted(n for n in names if n.startswith(("rackplane.io", "aiomqtt", "paho")))
           for m, names in MODULES.items() if m.startswith("rackplane/commands/")}
    assert bad and all(v == [] for v in bad.values()), bad


# --- dependency rules (DESIGN §2) ---------------------------------------------------------------

DAEMONS = ("valvey", "racky", "trayagent", "rlc")
CORE_DIRS = ("rackplane/core/", "valvey/core/", "racky/core/", "trayagent/core/",
             "rlc/core/")
# The simulators' plant models are pure cores too; their protocol faces and runtime are not.
# Entries ending in "/" are packages: every module under them is a pure core.
SIM_CORES = ("sims/cdu/", "sims/loads.py", "sims/sensors.py", "sims/scenario/",
             "sims/metrics.py", "sims/rack.py", "sims/power.py", "sims/environment.py",
             "sims/workloads/", "sims/row.py", "sims/fabric/", "sims/link_harness.py",
             "sims/backend/")
# What a pure core may never import: adapters, sockets, event loops, I/O libraries.
IO = {"asyncio", "socket", "pynvml", "ctypes", "redfish", "requests",
      "aiomqtt", "paho", "pymodbus", "influxdb_client", "urllib", "http",
      "serial", "sdnotify", "prometheus_client", "subprocess", "threading", "nats",
      "rackplane.io"}


def is_core(mod: str) -> bool:
    return mod.startswith(CORE_DIRS) or any(
        mod == c or (c.endswith("/") and mod.startswith(c)) for c in SIM_CORES)


def violations(modules: dict[str, set[str]], lazy: dict[str, set[str]] | None = None) -> list[str]:
    """Every import the architecture forbids, as ``module -> import: rule``.

    Rules: the shared runtime imports no daemon, simulator, harness or CLI; daemons import
    neither each other, the simulators, the harness nor the CLI; the simulators import no
    daemon; only the harness joins daemons and simulators (the CLI reaches the harness only
    lazily, inside a function); nothing imports ``tests``; pure cores import no adapter and no
    I/O library.
    """
    out: list[str] = []
    for mod, names in modules.items():
        pkg = mod.split("/")[0]
        for name in names:
            top = name.split(".")[0]
            rule = None
            if top == "tests" and pkg != "tests":
                rule = "product code imports tests"
            elif pkg == "rackplane" and top in {*DAEMONS, "sims", "harness", "rackctl"}:
                rule = "the shared runtime imports a daemon, simulator, harness or CLI"
            elif pkg in DAEMONS and top in {*DAEMONS, "sims", "harness", "rackctl"} - {pkg}:
                rule = "a daemon imports another daemon, a simulator, the harness or the CLI"
            elif pkg == "sims" and top in {*DAEMONS, "harness", "rackctl"}:
                rule = "a simulator imports a daemon, the harness or the CLI"
            elif pkg == "rackctl" and top in {"sims", "harness"} and name not in (
                    (lazy or {}).get(mod, set())):
                rule = "the CLI imports the harness or a simulator at module level"
            elif is_core(mod) and (name in IO or top in IO
                                   or any(name.startswith(p + ".") for p in IO)):
                rule = "a pure core imports an adapter or an I/O library"
            if rule:
                out.append(f"{mod} -> {name}: {rule}")
    return out


def test_dependency_rules() -> None:
    assert violations(MODULES, LAZY) == []


@pytest.mark.parametrize(("module", "planted"), [
    ("rackplane/core/samples.py", "rackplane.io.mqtt"),
    ("valvey/core/pumps.py", "asyncio"),
    ("racky/core/power.py", "pymodbus.client"),
    ("valvey/app.py", "tests.servers"),
    ("valvey/app.py", "racky.core.controller"),
    ("racky/app.py", "sims.scenario"),
    ("rackplane/io/mqtt/link.py", "valvey.config"),
    ("rackctl/client.py", "harness.servers"),
    ("sims/telemetry.py", "racky.core.telemetry"),
    ("sims/cdu/plant.py", "asyncio"),
    ("sims/cdu/registers.py", "rackplane.io.modbus"),
    ("trayagent/core/caps.py", "pynvml"),
    ("trayagent/app.py", "racky.core.telemetry"),
    ("trayagent/app.py", "sims.telemetry"),
    ("rackplane/core/leadership.py", "nats.js.kv"),
])
def test_dependency_rules_catch_a_planted_violation(module: str, planted: str) -> None:
    """The checker is shown to fail: each forbidden import, planted, is reported."""
    planted_graph = {m: set(n) for m, n in MODULES.items()}
    assert module in planted_graph, module
    planted_graph[module].add(planted)
    found = violations(planted_graph, LAZY)
    assert any(v.startswith(f"{module} -> {planted}:") for v in found), found


def test_every_core_module_is_checked() -> None:
    """Each core folder holds modules, and each is in the checked set; each simulator core
    exists (a module, or a package folder with modules), so a move cannot drop one."""
    for d in (*CORE_DIRS, *(c for c in SIM_CORES if c.endswith("/"))):
        mods = [m for m in MODULES if m.startswith(d)]
        assert len(mods) >= 3, d
        assert all(is_core(m) for m in mods)
    for c in SIM_CORES:
        mods = [m for m in MODULES if m == c or (c.endswith("/") and m.startswith(c))]
        assert mods and all(is_core(m) for m in mods), c


@pytest.mark.parametrize("module", sorted(m for m in MODULES if is_core(m)))
def test_pure_cores_read_no_clock(module: str) -> None:
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
