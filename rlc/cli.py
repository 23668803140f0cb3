"""rlc: run the fleet's power-budget allocator (Rack LifeCycle Controller), or check its
config."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from rackplane.cli import EXIT_OK
from rackplane.daemon_cli import DaemonCli, daemon_app
from rlc.app import Rlc, load_rlc_config
from rlc.config import RlcConfig, config_warnings


def _summary(cfg: RlcConfig, config: Path | None) -> str:
    t = cfg.topology
    racks = sum(len(row.racks) for h in t.halls.values() for row in h.rows.values())
    rows = sum(len(h.rows) for h in t.halls.values())
    lead = (f"replica {cfg.leadership.instance} (leadership bucket {cfg.leadership.bucket})"
            if cfg.leadership.enabled else "single instance")
    return (f"config OK: {config or '<embedded defaults>'}; site {t.site}: {len(t.halls)} "
            f"halls, {rows} rows, {racks} racks; fleet bucket {cfg.fleet.bucket} on "
            f"{', '.join(cfg.fleet.servers)}; lease ttl {cfg.leases.ttl_s:g} s; {lead}")


def _dry_connect(cfg: RlcConfig, console: Console) -> int:
    console.print("rlc reads no device: nothing to dry-connect (use --check-config)")
    return EXIT_OK


app = daemon_app(DaemonCli(
    name="rlc",
    help="rlc: shares row and hall power among racks as budget leases in the NATS KV store; "
    "run 2–3 replicas with [leadership] enabled (docs/RLC.md).",
    app_help=__doc__,
    config_model=RlcConfig,
    load=load_rlc_config,
    log_settings=lambda cfg: cfg.log,
    summary=_summary,
    warnings=config_warnings,
    dry_connect=_dry_connect,
    dry_connect_help="(no device to read: prints a note and exits 0)",
    build=lambda cfg, config: Rlc(cfg, config_path=config),
    no_args_is_help=False,
))


def main() -> None:
    app()


__all__ = ["app", "main"]
