"""Self-metrics of a daemon: in ``state/health``, in the time series, on Prometheus ``/metrics``.

Issue 7 lists what a site must see of the daemon itself: tick lateness, PV age, spool depth,
drops, reconnects and rejected commands. `SelfMetricsSnapshot` is the one schema of them: its
fields are the time-series fields of measurement `MEASUREMENT` (tag ``daemon``), the keys of
the ``self`` object in ``state/health`` and, prefixed ``rackplane_``, the Prometheus metric
names (counters get the ``_total`` suffix prometheus-client adds). The Grafana dashboards'
test derives the written fields from this dataclass.

The only prometheus-client importer. The endpoint (``[metrics] listen``, off by default) runs
prometheus-client's own HTTP server in a daemon thread; it reads an immutable snapshot the
control tick replaces every `REFRESH_S`, so a scrape never touches the event loop's objects
and a slow scraper never delays control. A port that cannot be bound is logged and the daemon
runs on without the endpoint (metrics must never stop cooling).

Use from a daemon (three lines)::

    self.selfmetrics = SelfMetrics("valvey", cfg.metrics, clock=clock)       # __init__
    self.selfmetrics.tick(now, tick_stats=..., writer=..., mqtt=..., commands=...,
                          devices=[self.device], pv_age_s=...)               # control tick
    health["self"] = self.selfmetrics.status()                               # health()

`rackplane.io.service.run_daemon` calls ``start()`` / ``stop()`` around ``run`` for a daemon
with a ``selfmetrics`` attribute.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest, start_http_server

from rackplane.clock import Clock
from rackplane.core.alarms import AlarmDef
from rackplane.core.samples import Sample
from rackplane.io.service import TickStats
from rackplane.log import get_logger
from rackplane.settings import MetricsSettings, parse_listen

__all__ = [
    "MEASUREMENT",
    "PROM_PREFIX",
    "REFRESH_S",
    "REFUSALS_MEASUREMENT",
    "TELEMETRY_ALARMS",
    "SelfMetrics",
    "SelfMetricsSnapshot",
    "counter_fields",
    "pv_age_s",
    "snapshot_fields",
    "telemetry_alarm_conditions",
]

MEASUREMENT = "daemon"
"""Time-series measurement of the self-metrics (tag ``daemon``: valvey, racky)."""

REFRESH_S = 1.0
"""How often `SelfMetrics.tick` refreshes the snapshot the endpoint and status serve, s."""

PROM_PREFIX = "rackplane_"

REFUSALS_MEASUREMENT = "command_refusals"
"""Time-series measurement of the refusals per code: tags ``daemon`` and ``code``, field
``refused`` (issue 14 item 13). A counter: monotonic since the daemon started (Python ints do
not wrap; written as floats, exact to 2**53 refusals), back to 0 at a restart, so a panel
shows it as a rate (``non_negative_derivative``). Its cardinality is bounded by the codes the
router and the daemon's handlers can refuse with."""


def _gauge(help_: str) -> Any:
    return field(metadata={"kind": "gauge", "help": help_})


def _counter(help_: str) -> Any:
    return field(metadata={"kind": "counter", "help": help_})


@dataclass(frozen=True, slots=True)
class SelfMetricsSnapshot:
    """The self-metrics at one moment (units in the names; counters since process start).

    Counters (``kind`` "counter" in the field metadata; `counter_fields`) are Python ints:
    no width, they never wrap or saturate; they start at 0 when the process starts, so a
    restart is a reset. Prometheus exposes them as counters (``_total``; ``rate()`` handles a
    reset); in the time series they are floats, exact up to 2**53, and the dashboards show
    them only as rates (``non_negative_derivative``: a reset is never a negative rate).
    """

    uptime_s: float = _gauge("seconds since the daemon started")
    tick_late_last_s: float = _gauge("lateness of the last control tick, s")
    tick_late_max_s: float = _gauge("largest control-tick lateness since start, s")
    tick_overruns: int = _counter("control ticks skipped because the loop fell behind")
    tick_woken: int = _counter(
        "control ticks run early because an input woke the ticker (e.g. racky's fleet link on "
        "a budget decrease; rackplane.io.service.run_ticker)")
    pv_age_s: float | None = _gauge(
        "age of the oldest control input (process variable), s; absent before the first read"
    )
    spool_depth_lines: int = _gauge("telemetry lines waiting (memory + spool)")
    spool_depth_bytes: int = _gauge("spool bytes waiting")
    spool_ok: bool = _gauge("1 when the spool is open and its last append worked")
    spool_errors: int = _counter("spool failures (disk full, unwritable)")
    telemetry_sent_lines: int = _counter("lines the database accepted")
    telemetry_dropped_lines: int = _counter(
        "lines lost: spool bound, memory bound while the spool failed, written after close"
    )
    telemetry_rejected_lines: int = _counter("lines the database refused as invalid")
    telemetry_ts_out_of_window_lines: int = _counter(
        "lines whose timestamp was outside 2020..2100: restamped, held or dropped per "
        "tsdb.ts_out_of_window, never written as they were (drops also in "
        "telemetry_dropped_lines)"
    )
    mqtt_connected: bool = _gauge("1 while the broker connection is up")
    mqtt_reconnects: int = _counter("broker connects accepted after the first")
    modbus_reconnects: int = _counter("Modbus TCP connects after the first, all devices")
    modbus_exception_replies: int = _counter(
        "Modbus exception responses received (any code: refused addresses, busy, gateway "
        "10/11), all devices"
    )
    modbus_invalid_samples: int = _counter(
        "samples read BAD or OUT_OF_RANGE (NaN/Inf, outside the point's range, decode "
        "failures), all devices; their values are never written, their _quality is"
    )
    input_invalid_samples: int = _counter(
        "MQTT inputs not usable: sensor samples that are unparsable, of the wrong type, "
        "NaN/Inf, a state that is no state or outside their plausibility window (valvey); "
        "tray telemetry and cooling messages refused, cooling values outside their windows "
        "(racky); never used, each counted"
    )
    lease_renew_latency_s: float | None = _gauge(
        "one of a redundant pair: the last leadership lease renewal, request sent to answer "
        "(or to giving up), s; absent for a single instance or before the first renewal"
    )
    leadership_acquisitions: int = _counter(
        "one of a redundant pair: tenures this instance began (failovers and handovers to it)"
    )
    commands_received: int = _counter("command messages received")
    commands_rejected: int = _counter("commands refused (any refusal code)")
    commands_refused: dict[str, int] = field(default_factory=dict, metadata={
        "kind": "counter_by_code",
        "help": "commands refused, per refusal code (label/tag code)"})

    def fields(self) -> dict[str, float | None]:
        """Time-series fields of measurement `MEASUREMENT`: numbers as float, booleans
        1.0/0.0, None left out by the writer (the per-code counters go to
        `REFUSALS_MEASUREMENT`, one point per code: `refusal_points`)."""
        out: dict[str, float | None] = {}
        for f in dataclasses.fields(self):
            if f.metadata["kind"] == "counter_by_code":
                continue
            v = getattr(self, f.name)
            out[f.name] = None if v is None else float(v)
        return out

    def refusal_points(self) -> list[tuple[dict[str, str], dict[str, float]]]:
        """(tags, fields) per refusal code for `REFUSALS_MEASUREMENT`: tag ``code``, field
        ``refused`` (the monotonic count since start), sorted by code."""
        return [({"code": code}, {"refused": float(n)})
                for code, n in sorted(self.commands_refused.items())]


def snapshot_fields() -> tuple[str, ...]:
    """Names of the self-metric fields, in order (the schema the dashboards' test reads)."""
    return tuple(f.name for f in dataclasses.fields(SelfMetricsSnapshot))


def counter_fields() -> tuple[str, ...]:
    """Names of the self-metric fields that are counters (monotonic since process start)."""
    return tuple(f.name for f in dataclasses.fields(SelfMetricsSnapshot)
                 if f.metadata["kind"] == "counter")


TELEMETRY_ALARMS: tuple[AlarmDef, ...] = (
    AlarmDef(
        id="telemetry_spool_failed", severity="major", off_delay_s=10.0,
        message="telemetry spool cannot be written (disk full, unwritable or another format "
        "version): telemetry waits in memory, the oldest telemetry is dropped and counted "
        "beyond spool.memory_max_lines; alarms and command audits are kept. Or it is held "
        "by another process: telemetry goes to a fallback folder beside it (logged)",
        runbook="operations-spool",
    ),
    AlarmDef(
        id="telemetry_backlog", severity="warning", on_delay_s=600.0, off_delay_s=30.0,
        message="telemetry not delivered for 10 min (database unreachable or refusing): the "
        "spool holds it and drains when the database is back",
        runbook="operations-database",
    ),
)
"""Alarms of the telemetry path, the same for every daemon (issue 7: a full or unwritable
spool raises a clear alarm). Add them to the daemon's `rackplane.core.alarms.AlarmEngine` and feed
`telemetry_alarm_conditions` with the rest of its conditions."""


def telemetry_alarm_conditions(writer_stats: Any) -> dict[str, bool]:
    """Conditions of `TELEMETRY_ALARMS` from a `rackplane.io.tsdb.TelemetryStats`: the spool is
    failing or held by another process (a fallback in use); lines are waiting while sends
    fail (backoff running)."""
    return {
        "telemetry_spool_failed": not writer_stats.spool_ok
        or getattr(writer_stats, "spool_fallback", None) is not None,
        "telemetry_backlog": writer_stats.depth_lines > 0 and writer_stats.backoff_s > 0,
    }


class _HasStats(Protocol):
    @property
    def stats(self) -> Any: ...


def pv_age_s(samples: Iterable[Sample | None], now_mono: float) -> float | None:
    """Age in s of the oldest of ``samples`` at ``now_mono`` (missing ones skipped); None when
    there is none yet. Pass the samples control depends on (valvey: supply temperature)."""
    ages = [s.age_s(now_mono) for s in samples if s is not None]
    return max(ages) if ages else None


class _Collector:
    """prometheus-client collector over the latest snapshot (read from the HTTP thread)."""

    def __init__(self, owner: SelfMetrics):
        self._owner = owner

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self._owner.snapshot
        if snap is None:
            return
        daemon = self._owner.daemon
        for f in dataclasses.fields(snap):
            v = getattr(snap, f.name)
            name, help_ = PROM_PREFIX + f.name, f.metadata["help"]
            fam: Metric
            if f.metadata["kind"] == "counter_by_code":
                fam = CounterMetricFamily(name, help_, labels=["daemon", "code"])
                for code, n in sorted(v.items()):
                    fam.add_metric([daemon, code], float(n))
                yield fam
                continue
            if v is None or (isinstance(v, float) and not math.isfinite(v)):
                continue
            if f.metadata["kind"] == "counter":
                fam = CounterMetricFamily(name, help_, labels=["daemon"])
            else:
                fam = GaugeMetricFamily(name, help_, labels=["daemon"])
            fam.add_metric([daemon], float(v))
            yield fam


class SelfMetrics:
    """Collects, publishes and serves a daemon's self-metrics.

    Args:
        daemon: ``valvey`` or ``racky`` (the ``daemon`` tag and label).
        settings: ``[metrics]``.
        clock: monotonic time for uptime.
        log: a structlog logger; default ``rackplane.io.selfmetrics``.
    """

    def __init__(
        self, daemon: str, settings: MetricsSettings, *, clock: Clock, log: Any = None
    ):
        self.daemon = daemon
        self.settings = settings
        self._clock = clock
        self._log = log if log is not None else get_logger("rackplane.io.selfmetrics")
        self._started = clock.monotonic()
        self.snapshot: SelfMetricsSnapshot | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._next_refresh = -math.inf
        self._next_write = -math.inf
        self._server: Any = None
        self.listening: tuple[str, int] | None = None
        self.points_written = 0

    # --- endpoint -------------------------------------------------------------------------

    def start(self) -> None:
        """Serve ``/metrics`` on ``settings.listen`` (no-op when unset). Never raises: a port
        that cannot be bound is logged (``metrics_endpoint_failed``) and left off."""
        if self.settings.listen is None or self._server is not None:
            return
        host, port = parse_listen(self.settings.listen)
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as err:
            self._log.error("metrics_endpoint_failed", listen=self.settings.listen,
                            error=str(err), effect="running without /metrics")
            return
        self._server = server
        self.listening = (host, int(server.server_address[1]))
        self._log.info("metrics_endpoint_listening", listen=f"{host}:{self.listening[1]}")

    def stop(self) -> None:
        """Stop the endpoint (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            self.listening = None

    def exposition(self) -> bytes:
        """The ``/metrics`` body now (Prometheus text format)."""
        return generate_latest(self.registry)

    # --- collecting -----------------------------------------------------------------------

    def collect(
        self,
        now_mono: float,
        *,
        tick_stats: TickStats,
        writer: _HasStats | None = None,
        mqtt: _HasStats | None = None,
        commands: _HasStats | None = None,
        devices: Sequence[_HasStats] = (),
        pv_age_s: float | None = None,
        input_invalid: int = 0,
        leadership: Any = None,
    ) -> SelfMetricsSnapshot:
        """A snapshot from the daemon's parts (each optional part contributes zeros when
        absent): ``writer`` a `rackplane.io.tsdb.TelemetryWriter`, ``mqtt`` a
        `rackplane.io.mqtt.MqttLink`, ``commands`` a `rackplane.commands.CommandRouter`,
        ``devices`` `rackplane.io.modbus.ModbusDevice` objects; ``input_invalid`` the
        daemon's count of unusable MQTT inputs (`input_invalid_samples`); ``leadership``
        a pair's `rackplane.io.nats.lease.LeaseRunner` (None: a single instance)."""
        w = writer.stats if writer is not None else None
        m = mqtt.stats if mqtt is not None else None
        c = commands.stats if commands is not None else None
        return SelfMetricsSnapshot(
            uptime_s=round(max(0.0, now_mono - self._started), 3),
            tick_late_last_s=tick_stats.late_last_s,
            tick_late_max_s=tick_stats.late_max_s,
            tick_overruns=tick_stats.overruns,
            tick_woken=tick_stats.woken,
            pv_age_s=pv_age_s,
            spool_depth_lines=w.depth_lines if w else 0,
            spool_depth_bytes=w.depth_bytes if w else 0,
            spool_ok=w.spool_ok if w else True,
            spool_errors=w.spool_errors if w else 0,
            telemetry_sent_lines=w.sent if w else 0,
            telemetry_dropped_lines=w.dropped if w else 0,
            telemetry_rejected_lines=w.rejected if w else 0,
            telemetry_ts_out_of_window_lines=w.ts_out_of_window if w else 0,
            mqtt_connected=bool(m.connected) if m else False,
            mqtt_reconnects=m.reconnects if m else 0,
            modbus_reconnects=sum(d.stats.reconnects for d in devices),
            modbus_exception_replies=sum(d.stats.exception_replies for d in devices),
            modbus_invalid_samples=sum(d.stats.invalid_samples for d in devices),
            input_invalid_samples=input_invalid,
            lease_renew_latency_s=(None if leadership is None
                                   else leadership.renew_latency_s),
            leadership_acquisitions=leadership.acquisitions if leadership is not None else 0,
            commands_received=c.received if c else 0,
            commands_rejected=c.refused_total if c else 0,
            commands_refused=dict(c.refused) if c else {},
        )

    def tick(
        self,
        now_mono: float,
        *,
        tick_stats: TickStats,
        writer: Any = None,
        mqtt: _HasStats | None = None,
        commands: _HasStats | None = None,
        devices: Sequence[_HasStats] = (),
        pv_age_s: float | None = None,
        input_invalid: int = 0,
        leadership: Any = None,
    ) -> None:
        """Call from the control tick: refreshes the snapshot every `REFRESH_S` and writes it
        to ``writer`` (measurement `MEASUREMENT`) every ``settings.interval_s``. Cheap
        otherwise (one comparison)."""
        if now_mono < self._next_refresh:
            return
        self._next_refresh = now_mono + REFRESH_S
        snap = self.collect(now_mono, tick_stats=tick_stats, writer=writer, mqtt=mqtt,
                            commands=commands, devices=devices, pv_age_s=pv_age_s,
                            input_invalid=input_invalid, leadership=leadership)
        self.snapshot = snap
        if writer is not None and now_mono >= self._next_write:
            self._next_write = now_mono + self.settings.interval_s
            if writer.write(MEASUREMENT, {"daemon": self.daemon}, snap.fields()):
                self.points_written += 1
            for tags, values in snap.refusal_points():
                writer.write(REFUSALS_MEASUREMENT, {"daemon": self.daemon, **tags}, values)

    def status(self) -> dict[str, Any]:
        """The latest snapshot as a dict for ``state/health`` (empty before the first tick)."""
        if self.snapshot is None:
            return {}
        return dataclasses.asdict(self.snapshot)
