"""rlc: run the fleet's power-budget allocator (Rack LifeCycle Controller), or check its
config."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from rackplane.cli import EXIT_OK, EXIT_RUNTIME
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
    """Open the fleet bucket once as rlc does (read-only: never made here) and read every
    rack's budget and rack keys; print what is there. Exit 0 when the bucket was read, 1 when
    no NATS server answered or the bucket cannot be used (missing, other replicas): a dry
    connect that reached nothing proves nothing."""
    import asyncio

    from rackplane.core.budget_leases import budget_key, rack_key
    from rackplane.io.nats.errors import KvError, KvUnknown
    from rackplane.io.nats.kv import NatsKv

    f, site = cfg.fleet, cfg.topology.site
    racks = [r for h in cfg.topology.halls.values() for row in h.rows.values() for r in row.racks]

    async def read() -> list[bool]:
        kv = await NatsKv.connect(f.servers, f.bucket, replicas=f.replicas,
                                  request_timeout_s=f.request_timeout_s, name="rlc-dry-connect",
                                  user=f.username, password=f.password(), create=False)
        try:
            got = await asyncio.gather(*(kv.read(k(site, r)) for r in racks
                                         for k in (budget_key, rack_key)))
        finally:
            await kv.close()
        return [g is not None for g in got]

    try:
        present = asyncio.run(read())
    except (KvError, KvUnknown) as err:
        Console(stderr=True).print(f"dry connect: fleet bucket {f.bucket} on "
                                   f"{', '.join(f.servers)}: {err}", markup=False,
                                   highlight=False)
        return EXIT_RUNTIME
    for i, r in enumerate(racks):
        lease, report = present[2 * i], present[2 * i + 1]
        console.print(f"rack {r}: budget lease {'present' if lease else 'none'}, racky report "
                      f"{'present' if report else 'none'}", markup=False, highlight=False)
    console.print(f"fleet bucket {f.bucket} read: {len(racks)} racks", markup=False,
                  highlight=False)
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
    dry_connect_help="read the fleet bucket's keys of every rack once (never writes), print "
                     "them, and exit (1 when NATS or the bucket cannot be reached)",
    build=lambda cfg, config: Rlc(cfg, config_path=config),
    no_args_is_help=False,
))


def main() -> None:
    app()


__all__ = ["app", "main"]
