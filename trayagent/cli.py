"""tray-agent: run the node agent of this host's compute trays, check its config, or read every
source once (``--dry-connect``)."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from rackplane.cli import EXIT_OK, EXIT_RUNTIME
from rackplane.config import secret_from_env
from rackplane.daemon_cli import DaemonCli, daemon_app
from trayagent.app import TrayAgent, load_tray_agent_config, make_source
from trayagent.config import TrayAgentConfig, config_warnings
from trayagent.core.health import GpuHealth
from trayagent.nvml import NvmlSource
from trayagent.redfish import BmcSource
from trayagent.sources import GpuSource, SourceError
from trayagent.sysfs import LinkRates, SysfsLinks


def _summary(cfg: TrayAgentConfig, config: Path | None) -> str:
    a = cfg.agents
    return (f"config OK: {config or '<embedded defaults>'}; agents '{a.daemon}': "
            f"{len(a.trays)} trays ({', '.join(str(t.tray) for t in a.trays) or 'none'}) x "
            f"{a.gpus_per_tray} GPUs; NVML {'on' if cfg.nvml.enabled else 'off'}; safe cap "
            f"{cfg.caps.safe_gpu_cap_w:g} W per GPU{'; DRY RUN' if cfg.caps.dry_run else ''}; "
            f"broker {cfg.mqtt.host}:{cfg.mqtt.port}")


def _out(console: Console, text: str) -> None:
    console.print(text, markup=False, highlight=False)


def dry_connect(cfg: TrayAgentConfig, console: Console, source: GpuSource | None = None
                ) -> int:
    """Read every source once and print every reading; exit 0, or 1 when a source could not
    be opened, a configured GPU could not be read, or nothing was reached at all (no GPU, BMC
    or port: a dry connect that read nothing proves nothing). Never sets anything."""
    rc_links, ports = _dry_connect_links(cfg, console)
    rc_bmcs, bmcs = _dry_connect_bmcs(cfg, console)
    rc = max(rc_links, rc_bmcs)
    kind = cfg.agents.source
    if kind == "nvml" and not cfg.nvml.enabled:
        _out(console, "nvml: disabled")
        return rc if _reached_any(console, ports + bmcs) else EXIT_RUNTIME
    src = source if source is not None else make_source(cfg)
    try:
        n = src.open()
        src.refresh()
    except SourceError as err:
        _out(console, f"{kind}: {err}")
        return EXIT_RUNTIME
    _out(console, f"{kind}: {n} GPUs")
    if not _reached_any(console, n + ports + bmcs):
        src.close()
        return EXIT_RUNTIME
    try:
        configured = {d: (t.tray, t.tray * cfg.agents.gpus_per_tray + i)
                      for t in cfg.agents.trays for i, d in enumerate(t.nvml_devices)}
        for dev in sorted(set(range(n)) | set(configured)):
            tray, gpu = configured.get(dev, (None, dev))
            r = src.read(dev, gpu)
            where = f"tray {tray} gpu {gpu}" if tray is not None else "not configured"
            _out(console, f"device {dev} ({where}): power_w={r.power_w} ({r.power_kind}) "
                 f"energy_mj={r.energy_mj} temp_c={r.temp_c} reasons={r.reasons} "
                 f"unknown_reason_bits={hex(r.unknown_reason_bits)} "
                 f"utilization={r.utilization} enforced_limit_w={r.limit_w} "
                 f"min_w={r.limits.min_w} max_w={r.limits.max_w} "
                 f"default_w={r.limits.default_w} lost={r.lost}")
            for k, why in sorted(r.errors.items()):
                _out(console, f"device {dev}: {k}: {why}")
            if isinstance(src, NvmlSource):
                _print_health(console, dev, src.read_health(dev))
            if tray is not None and (r.power_w is None or r.limit_w is None):
                rc = EXIT_RUNTIME
    finally:
        src.close()
    return rc


def _reached_any(console: Console, reached: int) -> bool:
    """False (said on stderr) when the dry connect read no GPU, BMC or port."""
    if reached:
        return True
    Console(stderr=True).print("dry connect reached nothing: no GPU found, no BMC read, no "
                               "port read (check nvml / dcgm, agents.trays[].bmc, sysfs)",
                               markup=False, highlight=False)
    return False


def _print_health(console: Console, dev: int, h: GpuHealth) -> None:
    """One device's NVLink and ECC figures (`NvmlSource.read_health`)."""
    _out(console, f"device {dev}: ecc corrected/uncorrected volatile="
         f"{h.ecc_corrected_volatile}/{h.ecc_uncorrected_volatile} aggregate="
         f"{h.ecc_corrected_aggregate}/{h.ecc_uncorrected_aggregate}; {len(h.links)} NVLinks")
    for nl in h.links:
        _out(console, f"device {dev} nvlink {nl.link}: active={nl.active} "
             + " ".join(f"{k}={v}" for k, v in nl.counters.items()))
    for k, why in sorted(h.errors.items()):
        _out(console, f"device {dev}: {k}: {why}")


def _dry_connect_bmcs(cfg: TrayAgentConfig, console: Console) -> tuple[int, int]:
    """Read every tray's BMC once and print its figures; (1 when one could not be read else
    0, how many BMCs were read without an error)."""
    rc = EXIT_OK
    read = 0
    for t in cfg.agents.trays:
        b = t.bmc
        if b is None:
            continue
        src = BmcSource(b.url, b.chassis, b.username, secret_from_env(b.password_env) or "",
                        b.timeout_s)
        r = src.read(time.monotonic())
        if t.actuation == "redfish":  # read only: what the cap would be written to
            src.power_control = b.power_control
            uri, ctl, why = src.read_power_control()
            _out(console, f"bmc tray {t.tray}: power control {uri}: "
                 + (why or " ".join(f"{k}={v}" for k, v in ctl.items())))
            rc = EXIT_RUNTIME if why else rc
        src.close()
        leak = None if r.leak is None else (
            f"leak={r.leak.leak} fault={r.leak.fault} detectors={r.leak.detectors}")
        _out(console, f"bmc tray {t.tray} ({b.url} chassis {b.chassis}): power_w={r.power_w} "
             f"coolant_out_temp_c={r.coolant_out_temp_c} {leak}")
        for k, why in sorted(r.errors.items()):
            _out(console, f"bmc tray {t.tray}: {k}: {why}")
        if r.errors:
            rc = EXIT_RUNTIME
        else:
            read += 1
    return rc, read


def _dry_connect_links(cfg: TrayAgentConfig, console: Console) -> tuple[int, int]:
    """Read every configured (or found) port twice, 1 s apart, and print its counters, widths
    and rates (unknown where they cannot vouch); (1 when a configured port is missing else 0,
    how many ports were read)."""
    s = cfg.sysfs
    if not s.enabled:
        _out(console, "sysfs: disabled")
        return EXIT_OK, 0
    links = SysfsLinks(s.root, ib_extended_counters=s.ib_extended_counters)
    names = s.ports or links.discover()
    _out(console, f"sysfs: {len(names)} ports under {s.root}")
    rates = LinkRates(s.max_rate_per_s)
    for n in names:
        rates.update(links.read(n, time.monotonic()))
    time.sleep(1.0)
    rc = EXIT_OK
    read = 0
    for n in names:
        r = links.read(n, time.monotonic())
        got = rates.update(r)
        _out(console, f"port {n} ({r.kind}): link_up={r.link_up} "
             f"speed_mb_per_s={r.speed_mb_per_s}")
        for k in sorted(r.counters):
            sp = r.specs[k]
            rate = got[k]
            shown = f"{rate.per_s:g}/s" if rate.per_s is not None else f"unknown ({rate.reason})"
            _out(console, f"port {n}: {k}={r.counters[k]} ({sp.bits} bits, "
                 f"{'saturates' if sp.saturates else 'wraps'}, x{sp.scale:g}) rate {shown}")
        for k, why in sorted(r.errors.items()):
            _out(console, f"port {n}: {k}: {why}")
        if "port" in r.errors and s.ports:
            rc = EXIT_RUNTIME
        read += "port" not in r.errors
    return rc, read


app = daemon_app(DaemonCli(
    name="tray-agent",
    help="""tray-agent: the node agent of this host's compute trays: publishes the node-agent
    contract v1 (telemetry/trayNN) and applies racky's set_power_limits as per-GPU power
    limits (NVML), reporting what is enforced (docs/TRAY-AGENT.md).""",
    app_help=__doc__,
    config_model=TrayAgentConfig,
    load=load_tray_agent_config,
    log_settings=lambda cfg: cfg.log,
    summary=_summary,
    dry_connect=dry_connect,
    dry_connect_help="read every GPU (and every source) once, print every reading, and exit "
                     "(never sets anything)",
    build=lambda cfg, config: TrayAgent(cfg, config_path=config),
    warnings=config_warnings,
))


def main() -> None:
    app()


__all__ = ["app", "dry_connect", "main"]
