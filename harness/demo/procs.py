"""The demo's parts: the embedded broker (its logging into the run folder), the daemons'
generated configs, processes, and how a person reaches the running demo."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from rackplane.config import toml_value

__all__ = [
    "BROKER_PROBE_S",
    "DEMO_RACK",
    "DEMO_SITE",
    "OPERATOR",
    "RACKY_BUDGET_W",
    "RACKY_INITIAL_STATE",
    "RACKY_QUARANTINE_ON",
    "RACK_NAMES",
    "SHELVES",
    "TRAYS_VIA",
    "TRAY_AGENTS",
    "BrokerUnreachable",
    "access_lines",
    "embedded_broker_problem",
    "probe_broker",
    "racky_config",
    "route_broker_logging",
    "spawn",
    "start_amqtt",
    "terminate",
    "valvey_config",
    "write_rackctl_config",
    "write_toml",
]

BROKER_PROBE_S = 3.0
"""How long ``--broker`` may take to accept a TCP connection before the demo says it is
unreachable, s (a connect, not a wait for data)."""

DEMO_SITE = "lab"
DEMO_RACK = "r12"
"""The demo rack's name: the one README.md's command examples address (``--rack r12``)."""
RACK_NAMES = ("r12", "r13", "r14", "r15")
"""The racks of ``rackctl demo --racks N``, the first N: README's rack ``r12`` and its
neighbours in the row, so that README's examples (``--rack r12``) reach the first rack."""
OPERATOR = "operator"
"""The broker username the demo gives the operator role in valvey and racky. The embedded
broker takes any login (loopback only, no password): the username level is not proven, as
it is behind a real broker's ACL (DESIGN §3)."""
SHELVES = 8
"""Power shelves of the virtual rack (REFERENCE §1.2), unit ids 1..8 on the sim's shelf port."""
RACKY_BUDGET_W = 140_000.0
"""racky's rack power budget in the demo, W: above the scenario's 132 kW peak, so racky
watches the load step without capping it (``set_budget`` below it caps the trays)."""

TRAY_AGENTS = "trays"
"""The topic level the demo's tray agents publish and take commands at (racky's
``node_agents.daemon``; `harness.simagent.agent_config`'s ``daemon``)."""
TRAYS_VIA = ("18 trays per rack through the real tray agent (trayagent, one per rack), "
             "simulated NVML/BMC/link sources")
"""How the demo's trays report (said in each rack's summary)."""

RACKY_INITIAL_STATE = "production"
"""The demo's rack starts in production (racky's ``[lifecycle] initial_state``; a new rack
of racky's defaults starts in provisioning), so that the scripted link flap shows racky
taking it out of production."""
RACKY_QUARANTINE_ON = ("link_flapping", "port_dropped")
"""racky's ``[lifecycle] quarantine_on_alarms`` in the demo: a flapping or dropped link
quarantines the rack, which then needs a new validation to return to production."""


class BrokerUnreachable(RuntimeError):
    """The broker given with ``--broker`` does not accept connections (the message says which
    and what to do); raised before anything is started."""


async def probe_broker(host: str, port: int, timeout_s: float = BROKER_PROBE_S) -> None:
    """Open (and close) a TCP connection to the broker.

    Raises:
        BrokerUnreachable: refused, no route, unknown host, or no answer in ``timeout_s``.
    """
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError) as err:
        why = f"no answer in {timeout_s:g} s" if isinstance(err, TimeoutError) else (
            err.strerror or str(err))
        raise BrokerUnreachable(
            f"the MQTT broker at {host}:{port} is unreachable ({why}); start it there, or "
            "leave out --broker to use the demo's embedded broker") from None
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def embedded_broker_problem() -> str | None:
    """Why the embedded broker (amqtt, the ``tools`` extra) cannot start, or None."""
    try:
        import amqtt.broker  # noqa: F401
    except Exception as err:  # ImportError, or a broken install raising anything else
        return f"{type(err).__name__}: {err}"
    return None


def route_broker_logging(log_path: Path) -> logging.Handler:
    """Send the embedded broker's logging (loggers ``amqtt``, ``transitions`` and
    ``asyncio``, which reports exceptions in the broker's connection callbacks, e.g. a client
    speaking MQTT v5 to it) to ``log_path`` only, never the console. Returns the handler
    (`logging.Handler.close` it at the end)."""
    handler = logging.FileHandler(log_path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name in ("amqtt", "transitions", "asyncio"):
        lg = logging.getLogger(name)
        lg.handlers = [handler]
        lg.propagate = False
        lg.setLevel(logging.INFO if name == "amqtt" else logging.WARNING)
    return handler


async def start_amqtt(port: int) -> Any:
    """amqtt on 127.0.0.1:``port`` (MQTT 3.1.1), any login accepted."""
    from amqtt.broker import Broker

    broker = Broker(
        {
            "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}},
            "plugins": {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
            },
        }
    )
    await broker.start()
    return broker


def write_toml(path: Path, data: dict[str, Any], title: str) -> None:
    """``data``: section -> values, or section -> list of tables (``[[section]]``); any other
    value is a top-level key (written before the sections)."""
    lines = [f"# Generated by rackctl demo: {title}."]
    sections = {k: v for k, v in data.items() if isinstance(v, dict) or (
        isinstance(v, list) and v and all(isinstance(x, dict) for x in v))}
    lines += [f"{k} = {toml_value(v)}" for k, v in data.items()
              if k not in sections and toml_value(v) is not None]
    for section, values in sections.items():
        tables = values if isinstance(values, list) else [values]
        for t in tables:
            lines.append(f"\n[[{section}]]" if isinstance(values, list) else f"\n[{section}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in t.items()]
    path.write_text("\n".join(lines) + "\n")


def _mqtt(host: str, port: int, protocol: str) -> dict[str, Any]:
    return {"host": host, "port": port, "protocol": protocol, "reconnect_min_s": 0.2,
            "reconnect_max_s": 2.0}


def valvey_config(run_dir: Path, modbus_port: int, host: str, port: int,
                  protocol: str, rack: str = DEMO_RACK) -> dict[str, Any]:
    """valvey's config for ``rack``: the sim's CDU, feedforward from racky's rack power (the
    default source), its spool in ``run_dir`` (the embedded store), the operator user."""
    return {
        "identity": {"site": DEMO_SITE, "rack": rack},
        "cdu": {"host": "127.0.0.1", "port": modbus_port},
        "mqtt": _mqtt(host, port, protocol),
        "spool": {"directory": str((run_dir / "spool").resolve())},
        "log": {"format": "json"},
        "feedforward": {"enabled": True, "source": "rack_power"},
        "commands": {"users": {OPERATOR: "operator"}},
    }


def racky_config(run_dir: Path, shelf_port: int, host: str, port: int,
                 protocol: str, rack: str = DEMO_RACK,
                 budget_w: float = RACKY_BUDGET_W) -> dict[str, Any]:
    """racky's config for ``rack``: the sim's 8 power shelves, the budget (W), its state,
    spool and reports in ``run_dir``, the lifecycle (`RACKY_INITIAL_STATE`,
    `RACKY_QUARANTINE_ON`), valvey's (automation) and the operator's roles, the trays read
    from the tray agent (`TRAY_AGENTS`)."""
    return {
        "identity": {"site": DEMO_SITE, "rack": rack},
        "mqtt": _mqtt(host, port, protocol),
        "power": {"budget_w": budget_w},
        "node_agents": {"daemon": TRAY_AGENTS},
        "lifecycle": {"state_file": str((run_dir / "racky-state.json").resolve()),
                      "initial_state": RACKY_INITIAL_STATE,
                      "quarantine_on_alarms": list(RACKY_QUARANTINE_ON)},
        "spool": {"directory": str((run_dir / "racky-spool").resolve())},
        "validation": {"report_dir": str((run_dir / "validation").resolve())},
        "log": {"format": "json"},
        "commands": {"users": {"valvey": "automation", OPERATOR: "operator"}},
        "power_shelves": [
            {"name": f"shelf{i}", "host": "127.0.0.1", "port": shelf_port, "unit_id": 1 + i,
             "register_map": "power-shelf"} for i in range(SHELVES)],
    }


def write_rackctl_config(path: Path, host: str, port: int, protocol: str) -> None:
    """rackctl's settings for the demo (flat keys, `rackctl.client.ClientSettings`)."""
    lines = ["# Generated by rackctl demo: export RACKCTL_CONFIG=<this file>, then the",
             "# README's rackctl examples reach the running demo.",
             f"host = {toml_value(host)}", f"port = {port}",
             f"protocol = {toml_value(protocol)}", f"username = {toml_value(OPERATOR)}",
             f"site = {toml_value(DEMO_SITE)}", f"rack = {toml_value(DEMO_RACK)}"]
    path.write_text("\n".join(lines) + "\n")


def access_lines(rackctl_toml: Path, host: str, port: int, protocol: str,
                 broker_kind: str, racks: tuple[str, ...] = (DEMO_RACK,),
                 rlc_toml: Path | None = None) -> list[str]:
    """How to reach the running demo: the broker, the operator, ready rackctl lines (the
    rackctl file addresses the first of ``racks``; ``--rack`` the others; with rlc running,
    ``rlc_toml`` its config: the row's ``rackctl fleet status`` line)."""
    cfg = rackctl_toml.resolve()
    # `rackctl` as the user's shell finds it: the venv's own path when its bin is not on PATH
    # (a second terminal after `make demo` has no activated venv)
    here = Path(sys.executable).parent / "rackctl"
    rc = "rackctl" if shutil.which("rackctl") or not here.exists() else str(here)
    return [
        f"broker: {host}:{port} ({broker_kind}, MQTT {protocol}); site {DEMO_SITE}, "
        f"{'rack' if len(racks) == 1 else 'racks'} {', '.join(racks)}; user {OPERATOR!r} has "
        "the operator role in valvey and racky",
        "talk to it from another terminal (the README's examples work as written):",
        f"  export RACKCTL_CONFIG={cfg}",
        f"  {rc} watch valvey",
        f"  {rc} cmd valvey set_setpoint --arg setpoint_c=44 --rack r12",
        f'  {rc} cmd racky set_budget --arg power_w=120000 --arg reason="row B feed work"',
        f"  (without the file: {rc} cmd valvey get_state --host {host} --port {port} "
        f"--username {OPERATOR} --rack {DEMO_RACK})",
        *[f"  {rc} watch valvey --rack {r}" for r in racks[1:]],
        *([f"  {rc} fleet status --rlc-config {rlc_toml.resolve()}   # the row's leases"]
          if rlc_toml is not None else []),
    ]


async def spawn(argv: list[str], log: Path) -> asyncio.subprocess.Process:
    """Start ``argv`` with stdout and stderr appended to ``log``."""
    fh = log.open("ab")
    try:
        return await asyncio.create_subprocess_exec(*argv, stdout=fh, stderr=fh)
    finally:
        fh.close()


async def terminate(proc: asyncio.subprocess.Process | None, timeout_s: float) -> int | None:
    """SIGTERM, then SIGKILL after ``timeout_s``; the exit code (None: never started)."""
    if proc is None:
        return None
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    return proc.returncode
