"""Running a daemon: signals, systemd notification, the control ticker, supervised tasks.

DESIGN §3 Service:
- one `asyncio.TaskGroup` per daemon with named tasks (the daemon's ``run`` owns it);
- ``READY=1`` once, after config load and the first control step (never waiting for the broker
  or the database: cooling must not depend on them);
- ``WATCHDOG=1`` from the control tick itself, so a wedged event loop stops the pings
  (FIELD-CASES BR-24); no pings when ``WATCHDOG_USEC`` is unset or ``WATCHDOG_PID`` names
  another process;
- SIGTERM/SIGINT ask the daemon to stop (it leaves outputs in their declared stop state and
  drains within its stop budget); SIGHUP asks it to reload.

sd_notify goes through the ``sdnotify`` library (pure Python, tiny, does nothing when
``NOTIFY_SOCKET`` is unset), chosen over hand-rolled datagram code. The library drops a
``NOTIFY_SOCKET`` it cannot use without a word; `Notifier` checks it at start and logs
``systemd_notify_socket_unusable`` once (a ``vsock:`` address, a relative path, a socket it
cannot connect to), and a send that fails later once per failing spell
(``systemd_notify_failed``, counted in ``send_errors``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

import sdnotify

from rackplane.clock import Clock
from rackplane.log import get_logger

__all__ = ["GIL_SWITCH_INTERVAL_S", "Daemon", "Notifier", "TickStats", "run_daemon", "run_ticker",
           "supervised"]


class Notifier:
    """systemd notification: READY once, WATCHDOG at most every half watchdog interval.

    Args:
        environ: the process environment (``NOTIFY_SOCKET``, ``WATCHDOG_USEC``, ``WATCHDOG_PID``).
        clock: monotonic time for the ping interval.
    """

    def __init__(self, clock: Clock, environ: dict[str, str] | None = None, *,
                 log: Any = None):
        env = dict(os.environ if environ is None else environ)
        self._clock = clock
        self._log = log if log is not None else get_logger("rackplane.io.service")
        address = env.get("NOTIFY_SOCKET") or None
        self.unusable: str | None = None
        """Why ``NOTIFY_SOCKET`` is set but cannot be used (logged once here), else None."""
        self._sd = self._connect(address) if address else None
        self._enabled = address is not None
        self.watchdog_interval_s: float | None = None
        usec = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        ours = pid is None or (pid.isdigit() and int(pid) == os.getpid())
        if self._enabled and usec and usec.isdigit() and int(usec) > 0 and ours:
            # Ping at a quarter of the interval: well inside the ≤ WATCHDOG_USEC/2 BR-24 asks.
            self.watchdog_interval_s = int(usec) / 1e6 / 4
        self.ready_sent = False
        self.send_errors = 0
        self._send_failing = False
        self._last_ping: float | None = None
        self.pings = 0

    def _connect(self, address: str) -> Any:
        """An sdnotify notifier for ``address``, or None after logging why it cannot be used.

        systemd sets an absolute path or an abstract socket (``@name``); ``vsock:``
        addresses (systemd >= 254, for VMs) and anything else are not supported by the
        library, which would drop them without a word (issue 14 item 15).
        """
        if address.startswith("vsock:"):
            why = "AF_VSOCK addresses are not supported (sdnotify speaks AF_UNIX only)"
        elif not address.startswith(("/", "@")):
            why = "not an absolute path or an abstract socket (@name)"
        else:
            why = None
        sd = None
        if why is None:
            saved = os.environ.get("NOTIFY_SOCKET")
            os.environ["NOTIFY_SOCKET"] = address  # sdnotify reads it from the environment
            try:
                sd = sdnotify.SystemdNotifier(debug=True)
            except OSError as err:
                why = f"cannot connect: {err}"
            finally:
                if saved is None:
                    del os.environ["NOTIFY_SOCKET"]
                else:
                    os.environ["NOTIFY_SOCKET"] = saved
        if why is not None:
            self.unusable = why
            self._log.error(
                "systemd_notify_socket_unusable", notify_socket=address, reason=why,
                effect="no READY/WATCHDOG/STOPPING notifications: a Type=notify unit times "
                "out at start, and WatchdogSec= would kill the daemon; see docs/OPERATIONS.md")
            return None
        return sd  # debug=True: a send failure raises, so `_send` counts and logs it

    def _send(self, msg: str) -> None:
        if self._sd is None:
            return
        try:
            self._sd.notify(msg)
        except OSError as err:
            self.send_errors += 1
            if not self._send_failing:
                self._send_failing = True
                self._log.error("systemd_notify_failed", error=str(err), message=msg[:40])
            return
        if self._send_failing:
            self._send_failing = False
            self._log.info("systemd_notify_recovered")

    def ready(self, status: str = "") -> None:
        """Send ``READY=1`` (once; later calls do nothing)."""
        if self.ready_sent:
            return
        self.ready_sent = True
        self._send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def tick(self) -> None:
        """Called by the control tick: sends ``WATCHDOG=1`` when one is due."""
        if self.watchdog_interval_s is None:
            return
        now = self._clock.monotonic()
        if self._last_ping is None or now - self._last_ping >= self.watchdog_interval_s:
            self._last_ping = now
            self.pings += 1
            self._send("WATCHDOG=1")

    def stopping(self, status: str = "") -> None:
        self._send("STOPPING=1" + (f"\nSTATUS={status}" if status else ""))

    def status(self, text: str) -> None:
        self._send(f"STATUS={text}")

    def reloading(self) -> None:
        """``RELOADING=1`` at the start of a SIGHUP reload; `reloaded` ends it."""
        self._send("RELOADING=1")

    def reloaded(self) -> None:
        """``READY=1`` again after a reload (systemd expects it after RELOADING=1)."""
        self._send("READY=1\nSTATUS=reloaded")


@dataclass
class TickStats:
    """Lateness of a fixed-rate ticker, in s (p50/p99 are computed by the benchmarks)."""

    ticks: int = 0
    late_max_s: float = 0.0
    late_last_s: float = 0.0
    overruns: int = 0
    woken: int = 0
    """Ticks run early because an input woke the ticker (`run_ticker` ``wake``)."""
    recent_late_s: list[float] = field(default_factory=list)

    def record(self, late_s: float, keep: int = 600) -> None:
        self.ticks += 1
        self.late_last_s = late_s
        self.late_max_s = max(self.late_max_s, late_s)
        self.recent_late_s.append(late_s)
        if len(self.recent_late_s) > keep:
            del self.recent_late_s[: len(self.recent_late_s) - keep]


WAKE_MIN_GAP_S = 0.05
"""An early tick (`run_ticker` ``wake``) runs no sooner than this after the previous tick
began, s (default)."""


async def run_ticker(
    period_s: float,
    step: Callable[[float], Awaitable[None] | None],
    clock: Clock,
    stats: TickStats | None = None,
    wake: asyncio.Event | None = None,
    wake_min_gap_s: float = WAKE_MIN_GAP_S,
) -> None:
    """Call ``step(now_mono)`` every ``period_s`` on a fixed schedule (no drift).

    A late tick is run at once; if the loop fell more than one period behind, the missed
    ticks are skipped (counted in ``stats.overruns``), never replayed in a burst.

    ``wake``: an input that cannot wait for the next tick sets it (e.g. racky's fleet link on
    a budget decrease): the next tick then runs **now** (the same ``step``; its ``now_mono``
    is the real time, so a step's dt is the real time elapsed) and the schedule goes on one
    period after it (the tick moved earlier; never an extra tick squeezed in before the next
    scheduled one). An early tick runs no sooner than ``wake_min_gap_s`` after the previous
    tick began (a flood of wakes cannot make the tick spin). The event is cleared as each
    tick begins: a wake set before that tick is served by it. Counted in ``stats.woken``.
    Runs until cancelled.
    """
    next_t = clock.monotonic()
    while True:
        now = clock.monotonic()
        late = now - next_t
        if late > period_s:
            skipped = int(late // period_s)
            next_t += skipped * period_s
            if stats is not None:
                stats.overruns += skipped
            late = now - next_t
        if stats is not None:
            stats.record(max(0.0, late))
        if wake is not None:
            wake.clear()
        began = now
        result = step(now)
        if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
            await result
        next_t += period_s
        delay = next_t - clock.monotonic()
        # asyncio.sleep runs on the loop's monotonic clock; the schedule itself is kept in
        # next_t, so sleep inaccuracy never accumulates.
        if wake is None:
            await asyncio.sleep(max(0.0, delay))
            continue
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, delay)):
                await wake.wait()
        if wake.is_set() and clock.monotonic() < next_t:  # woken: the next tick runs now
            gap = began + wake_min_gap_s - clock.monotonic()
            if gap > 0:
                await asyncio.sleep(min(gap, max(0.0, next_t - clock.monotonic())))
            next_t = min(next_t, clock.monotonic())
            if stats is not None:
                stats.woken += 1


class Daemon(Protocol):
    """What `run_daemon` drives. ``run`` returns when ``stop`` is set and shutdown is done."""

    async def run(self, stop: asyncio.Event) -> None: ...

    def reload(self) -> None: ...


GIL_SWITCH_INTERVAL_S = 0.001
"""The thread switch interval a daemon runs with (`sys.setswitchinterval`), s: how long the
event loop's thread may wait for the GIL a worker thread holds (Python's default: 0.005)."""


async def run_daemon(daemon: Daemon, name: str, *, freeze_gc: bool = True) -> int:
    """Run ``daemon`` until SIGTERM/SIGINT; SIGHUP calls ``daemon.reload()``; the daemon's
    ``selfmetrics`` endpoint, if it has one, is started before and stopped after ``run``.

    With ``freeze_gc`` (the default), everything alive once start-up is done (imports,
    config, the daemon object) is collected once and moved to the garbage collector's
    permanent generation (`gc.freeze`) for as long as ``run`` runs, so a full collection
    during a command burst no longer stalls the control tick (FIELD-CASES BR-24 d: loop lag
    < 100 ms).

    The interpreter's thread switch interval is `GIL_SWITCH_INTERVAL_S` while ``run`` runs
    (restored after): a control tick that falls due while a worker thread (a TSDB send, an
    fsync, a Modbus or NVML call in ``to_thread``) holds the GIL waits for it at most about
    that long, not Python's default 5 ms.

    Returns the process exit code (0 after a clean stop).
    """
    log = get_logger(f"{name}.service")
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def _stop(signame: str) -> None:
        if not stop.is_set():
            log.info("stop_requested", signal=signame)
        stop.set()

    def _reload() -> None:
        log.info("reload_requested", signal="SIGHUP")
        try:
            daemon.reload()
        except Exception as err:  # a bad reload keeps the running config
            log.error("reload_failed", error=str(err))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stop, sig.name)
    loop.add_signal_handler(signal.SIGHUP, _reload)
    # A daemon with a `rackplane.io.selfmetrics.SelfMetrics` as ``selfmetrics`` gets its
    # /metrics endpoint (when configured) served for as long as it runs.
    metrics = getattr(daemon, "selfmetrics", None)
    if metrics is not None:
        metrics.start()
    if freeze_gc:
        # Start-up leaves ~85 k long-lived objects (modules, pydantic models, the register
        # map); every full (gen-2) collection walked them all: 45-70 ms on the loop, measured
        # in valvey during a 1,000-command burst (BR-24 d), 100-180 ms with a CPU hog on the
        # other core. Frozen, a full collection walks only what the daemon made since (~4 k
        # objects, ~2 ms). Unfrozen again on the way out for in-process callers (tests).
        gc.collect()
        gc.freeze()
    switch_s = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        await daemon.run(stop)
    finally:
        sys.setswitchinterval(switch_s)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        if metrics is not None:
            metrics.stop()
        if freeze_gc:
            gc.unfreeze()
    return 0


def supervised(
    name: str, coro_fn: Callable[[], Awaitable[Any]], log: Any, restart_delay_s: float = 1.0
) -> Callable[[], Coroutine[Any, Any, None]]:
    """Wrap an owner task so an unexpected exception is logged and the task restarted.

    Owner tasks are written never to raise; this is the last line of defence (a bulkhead:
    one failing adapter never takes the control tick down with it). A task being cancelled
    is never restarted, even when its clean-up raised something else on the way out (the
    error is logged; the cancellation goes on).
    """

    async def runner() -> None:
        task = asyncio.current_task()
        while True:
            try:
                await coro_fn()
                return
            except asyncio.CancelledError:
                raise
            except Exception as err:
                if task is not None and task.cancelling():
                    log.error("task_failed_while_cancelled", task=name, error=repr(err),
                              exc_info=True)
                    raise asyncio.CancelledError() from err
                log.error("task_crashed_restarting", task=name, error=repr(err), exc_info=True)
                await asyncio.sleep(restart_delay_s)

    return runner
