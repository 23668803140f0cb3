"""racky: run the rack power and infrastructure manager, check its config, or read every power
shelf once (and probe the discovery range)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.console import Console

from rackplane.cli import EXIT_OK, EXIT_RUNTIME, samples_table
from rackplane.clock import SYSTEM_CLOCK
from rackplane.config import check_state_file_dir
from rackplane.core.registers import load_register_map
from rackplane.core.samples import Sample
from rackplane.daemon_cli import DaemonCli, daemon_app
from rackplane.errors import ModbusError
from rackplane.io.modbus import ModbusDevice
from racky.app import Racky, input_warnings, load_racky_config, shelf_target
from racky.config import RackyConfig, config_warnings
from racky.persist import lifecycle_state_file


def _load(config: Path | None) -> RackyConfig:
    """The config, cross-checked; the state file's folder checked.

    Raises:
        ConfigError: naming the key path.
    """
    cfg = load_racky_config(config)
    check_state_file_dir("lifecycle.state_file", lifecycle_state_file(cfg))
    return cfg


def _summary(cfg: RackyConfig, config: Path | None) -> str:
    a = cfg.node_agents
    return (
        f"config OK: {config or '<embedded defaults>'}; {len(cfg.power_shelves)} power "
        f"shelves; discovery {'on' if cfg.discovery.enabled else 'off'}; node agents "
        f"'{a.daemon}' ({a.trays} trays x {a.gpus_per_tray} GPUs); budget "
        f"{'none' if cfg.power.budget_w is None else f'{cfg.power.budget_w:g} W'}; state file "
        f"{lifecycle_state_file(cfg)}; broker {cfg.mqtt.host}:{cfg.mqtt.port}; "
        f"tsdb {cfg.tsdb.url or 'embedded spool'}"
    )


def _dry_connect(cfg: RackyConfig, console: Console) -> int:
    """Read every configured shelf once; probe every discovery unit id once. Exit 0 when
    every configured shelf answered and at least one shelf did; 1 otherwise: a shelf that
    did not answer, or nothing read at all (no shelf configured and discovery off, or no
    shelf found): a dry connect that reached no device proves nothing."""

    async def read(target: object) -> list[Sample]:
        assert hasattr(target, "register_map")
        dev = ModbusDevice(target, load_register_map(target.register_map),  # type: ignore[arg-type]
                           clock=SYSTEM_CLOCK, on_samples=lambda s: None)
        return await dev.read_once()

    rc = EXIT_OK
    targets = list(cfg.power_shelves)
    if cfg.discovery.enabled:
        d = cfg.discovery
        targets += [shelf_target(cfg, u) for u in range(d.unit_id_first, d.unit_id_last + 1)]
    if not targets:
        Console(stderr=True).print(
            "dry connect read nothing: no power_shelves configured and discovery is off "
            "(configure [[power_shelves]] or enable [discovery])", markup=False, highlight=False)
        return EXIT_RUNTIME
    found = 0
    for t in targets:
        try:
            samples = asyncio.run(read(t))
        except ModbusError as err:
            console.print(f"{t.name} {t.host}:{t.port} unit {t.unit_id}: {err}", markup=False,
                          highlight=False)
            rc = EXIT_RUNTIME
            continue
        if not any(s.usable for s in samples):
            console.print(f"{t.name} {t.host}:{t.port} unit {t.unit_id}: no answer",
                          markup=False, highlight=False)
            if t in cfg.power_shelves:
                rc = EXIT_RUNTIME
            continue
        found += 1
        title = f"{t.name} {t.host}:{t.port} unit {t.unit_id}"
        console.print(samples_table(title, samples, {}))
    console.print(f"{found} of {len(targets)} shelves answered")
    if found == 0:
        d = cfg.discovery
        where = (f"; discovery {d.host}:{d.port} units {d.unit_id_first}..{d.unit_id_last}"
                 if d.enabled else "")
        Console(stderr=True).print(
            f"dry connect reached no power shelf ({len(cfg.power_shelves)} configured{where})",
            markup=False, highlight=False)
        return EXIT_RUNTIME
    return rc


app = daemon_app(DaemonCli(
    name="racky",
    help="""racky: rack power capping and sequencing, link health, thermal and traffic detection,
    the rack lifecycle (Modbus TCP, MQTT, InfluxDB). Validation on the simulator:
    "rackctl lockstep --daemon racky validate"; on a live rack: the start_validation command
    (docs/RACKY.md).""",
    app_help=__doc__,
    config_model=RackyConfig,
    load=_load,
    log_settings=lambda cfg: cfg.log,
    summary=_summary,
    dry_connect=_dry_connect,
    dry_connect_help="read every power shelf once (and probe the discovery range), print it, "
                     "and exit",
    warnings=lambda cfg: config_warnings(cfg) + input_warnings(cfg),
    build=lambda cfg, config: Racky(cfg, config_path=config),
))


def main() -> None:
    app()


__all__ = ["app", "main"]
