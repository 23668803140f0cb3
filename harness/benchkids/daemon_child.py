"""Run racky or valvey exactly as their console scripts do (`rackplane.io.service.run_daemon`), with
counters the benchmarks need and the daemons do not publish, written as JSON at exit.

Usage: ``python -m harness.benchkids.daemon_child racky|valvey CONFIG STATS_JSON [SCHED]``

``SCHED``: the scheduling the daemon's systemd unit and its drop-ins give it, applied to this
process before anything else (`harness.benchrow.unit_scheduling`): ``rr:PRIORITY`` or
``fifo:PRIORITY`` (real-time), with ``:reset`` for reset on fork (the threads the daemon starts
run at the normal policy, as ``CPUSchedulingResetOnFork=yes`` makes them); ``other`` or absent:
the normal policy. Whether it was applied (it needs CAP_SYS_NICE) is written as ``sched`` in
the stats.

* racky: every tray payload handed to ``TelemetryIngest.tray_payload`` is counted (first and
  last monotonic time), so the benchmark can compare what it published with what racky parsed.
* valvey: every control-tick lateness is kept (``TickStats.recent_late_s`` keeps only 600).
* both: the monotonic time of every tick (``tick_mono``, beside ``late_s``; CLOCK_MONOTONIC is
  system-wide, so the benchmark cuts its measured window out of them).

The stats file is written when the daemon stops (SIGTERM). Nothing else differs from
``racky --config CONFIG`` / ``valvey --config CONFIG``.

Diagnostics: with ``RACKPLANE_BENCH_SLOW_CALLBACK_MS`` set, every event-loop callback that ran
that long or longer is recorded (``slow_callbacks``: ``[start_mono, s, what]``), to see what
held the loop when a tick was late (it slows the daemon: never on for published figures).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rackplane.cli import setup_logging
from rackplane.io.service import TickStats, run_daemon


class _KeepAll(TickStats):
    """`TickStats` keeping every tick's lateness (s) and its monotonic time (s)."""

    def __init__(self) -> None:
        super().__init__()
        self.tick_mono: list[float] = []

    def record(self, late_s: float, keep: int = 600) -> None:
        self.tick_mono.append(time.monotonic())
        super().record(late_s, keep=10**8)


def _racky(cfg_path: Path, stats: dict[str, Any]) -> Any:
    from racky.app import Racky, load_racky_config

    cfg = load_racky_config(cfg_path)
    setup_logging(None, None, cfg.log)
    daemon = Racky(cfg, config_path=cfg_path)
    daemon.tick_stats = _KeepAll()
    ingest = daemon.ingest
    parse = ingest.tray_payload

    def counted(payload: Any, t_mono: float, *args: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        if stats["parsed"] == 0:
            stats["first_mono"] = now
        stats["parsed"] += 1
        stats["last_mono"] = now
        return parse(payload, t_mono, *args, **kwargs)

    stats.update(parsed=0, first_mono=None, last_mono=None)
    setattr(ingest, "tray_payload", counted)  # noqa: B010 - wraps the bound method
    return daemon


def _valvey(cfg_path: Path, stats: dict[str, Any]) -> Any:
    from valvey.app import Valvey, load_valvey_config

    cfg, regmap = load_valvey_config(cfg_path)
    setup_logging(None, None, cfg.log)
    daemon = Valvey(cfg, regmap, config_path=cfg_path)
    daemon.tick_stats = _KeepAll()
    return daemon


async def _run(daemon: Any, which: str, marker: Path) -> int:
    """`run_daemon`, plus ``marker`` written once the broker granted every subscription (the
    benchmark starts its load only then, so nothing is lost to a late subscribe)."""

    async def watch() -> None:
        mq = daemon.mqtt
        while not (mq.configured_topics and mq.subscribed_topics == mq.configured_topics):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        marker.write_text("1")  # noqa: ASYNC240 - once

    task = asyncio.create_task(watch())
    try:
        return await run_daemon(daemon, which)
    finally:
        task.cancel()


def _watch_slow_callbacks(stats: dict[str, Any], min_s: float) -> None:
    """Record every event-loop callback that ran ``min_s`` or longer: ``[start_mono, dt_s,
    what]`` rows in ``stats["slow_callbacks"]`` (diagnostics: what held the loop when a tick
    was late)."""
    import asyncio.events

    slow: list[list[Any]] = []
    stats["slow_callbacks"] = slow
    run = asyncio.events.Handle._run
    mono = time.monotonic

    def timed(self: Any) -> None:
        t0 = mono()
        run(self)
        dt = mono() - t0
        if dt >= min_s:
            cb = getattr(self, "_callback", None)
            key = getattr(cb, "__qualname__", None) or repr(cb)[:80]
            task = getattr(cb, "__self__", None)
            if isinstance(task, asyncio.Task):
                coro = task.get_coro()
                key = f"task {getattr(coro, '__qualname__', repr(coro)[:60])}"
            slow.append([t0, dt, key])

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]


def apply_scheduling(spec: str) -> str:
    """Put this process under ``spec`` (module docstring): ``other``, or ``rr:N`` /
    ``fifo:N`` with ``:reset`` for reset on fork; returns what was done, for the stats: the
    spec, or ``"not applied (<spec>): <why>"``.

    Raises:
        ValueError: ``spec`` is none of those.
    """
    if spec in ("", "other"):
        return "other"
    kind, _, rest = spec.partition(":")
    prio, _, flag = rest.partition(":")
    policies = {"rr": os.SCHED_RR, "fifo": os.SCHED_FIFO}
    if kind not in policies or not prio.isdigit() or flag not in ("", "reset"):
        raise ValueError(f"scheduling {spec!r}: expected other, rr:N[:reset] or fifo:N[:reset]")
    policy = policies[kind] | (os.SCHED_RESET_ON_FORK if flag else 0)
    try:
        os.sched_setscheduler(0, policy, os.sched_param(int(prio)))
    except OSError as err:  # no CAP_SYS_NICE (not root, or a container without it)
        return f"not applied ({spec}): {err.strerror or err}"
    return spec


def main(argv: list[str]) -> int:
    which, cfg_path, out = argv[0], Path(argv[1]), Path(argv[2])
    stats: dict[str, Any] = {"daemon": which}
    stats["sched"] = apply_scheduling(argv[3] if len(argv) > 3 else "other")
    if os.environ.get("RACKPLANE_BENCH_SLOW_CALLBACK_MS"):
        _watch_slow_callbacks(stats, float(os.environ["RACKPLANE_BENCH_SLOW_CALLBACK_MS"]) / 1000)
    daemon = _racky(cfg_path, stats) if which == "racky" else _valvey(cfg_path, stats)
    rc = asyncio.run(_run(daemon, which, Path(str(out) + ".subscribed")))
    ts = daemon.tick_stats
    stats.update(ticks=ts.ticks, overruns=ts.overruns, late_max_s=ts.late_max_s,
                 late_s=list(ts.recent_late_s),
                 tick_mono=list(getattr(ts, "tick_mono", [])))
    mq = getattr(daemon, "mqtt", None)
    if mq is not None:
        stats["mqtt_messages_in"] = mq.stats.messages_in
    ing = getattr(daemon, "ingest", None)
    if ing is not None:
        stats["payload_errors"] = ing.errors
    out.write_text(json.dumps(stats))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
