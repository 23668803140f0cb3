"""Hooks for the daemons' verbs: config limits (`require_within`), the generic lease verbs
(`register_lease_verbs`) and `LeaseGate`, a daemon's leases wired in one object (DESIGN §1;
the rules are in `rackplane.core.leases`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

from rackplane.commands.bounds import ArgBound, register_bounded
from rackplane.commands.router import LOGGER, CommandRouter
from rackplane.core.envelope import (
    OUT_OF_RANGE,
    AcquireLeaseArgs,
    CommandContext,
    ReleaseLeaseArgs,
)
from rackplane.core.leases import INVALID_LEASE_TTL, LeaseTable
from rackplane.errors import CommandError
from rackplane.log import get_logger
from rackplane.settings import Role

__all__ = ["LeaseChange", "LeaseGate", "register_lease_verbs", "require_within"]

def require_within(name: str, value: float, low: float, high: float, unit: str = "") -> None:
    """Refuse a value outside its config limits (DESIGN §1: a command can never push an
    output past its config limits). Call it in a handler before mutating.

    Args:
        name: the argument's name as the client sent it (e.g. ``output_pct``).
        value, low, high: the value and its inclusive limits, in ``unit``.

    Raises:
        CommandError: ``out_of_range`` naming the value, the limits and the unit (also for a
            NaN or infinite value).
    """
    if not (math.isfinite(value) and low <= value <= high):
        u = f" {unit}" if unit else ""
        raise CommandError(OUT_OF_RANGE, f"{name} = {value:g}{u} is outside the configured "
                           f"limits [{low:g}, {high:g}]{u}")


LeaseChange = Callable[[LeaseTable], None]


def register_lease_verbs(
    router: CommandRouter,
    table: LeaseTable,
    *,
    on_change: LeaseChange | None = None,
    role: Role = "automation",
) -> None:
    """Register the generic verbs ``acquire_lease`` and ``release_lease`` on ``router``
    (DESIGN §1 leases; rules in rackplane.core.leases).

    Both reply ``state = {"output", "lease": {...} | null, "released": bool (release only),
    "leases": table.snapshot(now)}``. Refusals: the `rackplane.core.leases.LEASE_CODES`. The TTL
    bounds come from the router's settings (``commands.lease_default_ttl_s`` /
    ``lease_max_ttl_s``) at each call, so a SIGHUP reload applies at once.

    Args:
        router: the daemon's command router.
        table: the daemon's lease table (its tick calls ``table.expire(now)``, then logs and
            publishes ``table.drain_events()`` and ``table.snapshot(now)``).
        on_change: called after a lease changed (e.g. to publish ``state/leases`` at once);
            its exceptions are logged, never turned into a refusal (the change is made).
        role: least role of both verbs (readers never hold leases).

    Raises:
        ValueError: a verb is already registered on ``router``.
    """
    log = get_logger(LOGGER, daemon=router.link.daemon)

    def changed() -> None:
        if on_change is None:
            return
        try:
            on_change(table)
        except Exception as err:
            log.error("lease_on_change_failed", error=repr(err), exc_info=True)

    def limits() -> None:
        st = router.settings
        table.set_limits(st.lease_default_ttl_s, st.lease_max_ttl_s)

    def acquire(args: AcquireLeaseArgs, ctx: CommandContext) -> dict[str, Any]:
        limits()
        lease = table.acquire(args.output, ctx.user, ctx.role, ctx.now_mono, args.ttl_s,
                              args.reason)
        changed()
        return {"output": args.output, "lease": lease.as_dict(ctx.now_mono),
                "leases": table.snapshot(ctx.now_mono)}

    def release(args: ReleaseLeaseArgs, ctx: CommandContext) -> dict[str, Any]:
        lease = table.release(args.output, ctx.user, ctx.role, ctx.now_mono, force=args.force)
        if lease is not None:
            changed()
        return {"output": args.output, "released": lease is not None,
                "lease": lease.as_dict(ctx.now_mono) if lease is not None else None,
                "leases": table.snapshot(ctx.now_mono)}

    def ttl_bound() -> ArgBound:
        return ArgBound(0.0, router.settings.lease_max_ttl_s, "s",
                        "commands.lease_max_ttl_s", code=INVALID_LEASE_TTL, lo_open=True)

    register_bounded(router, "acquire_lease", AcquireLeaseArgs, acquire, role,
                     {"ttl_s": ttl_bound})
    router.register("release_lease", ReleaseLeaseArgs, release, role=role)


class LeaseGate:
    """A daemon's leases wired in one object (DESIGN §1): registers ``acquire_lease`` /
    ``release_lease`` on the router, checks a verb's outputs before its handler mutates,
    takes the active interlocks from the tick, expires leases, logs every change once and
    publishes ``state/leases`` (retained; `LeasesState`, "the state shows the holder").

    A daemon uses it in three lines::

        gate = LeaseGate(router, LeaseTable({"facility_valve": "...", ...}))
        # in a handler, before mutating (raises CommandError: interlock_active, lease_held,
        # lease_required, unknown_output):
        gate.check("facility_valve", ctx, require_lease=manual)
        # in the control tick: the outputs its safety interlocks hold now
        gate.tick(now, {"facility_valve": "supply_temp_high_interlock"} if hot else {})

    ``check`` has the ``lease_check(output, ctx)`` shape racky's commands take.
    ``state/leases`` is published when a lease or an interlock changes, and every
    ``refresh_s`` while a lease is held (its ``expires_in_s`` counts down), never once per tick.

    Args:
        router: the daemon's command router (its link publishes ``state/leases``).
        table: the daemon's `LeaseTable`.
        role: least role of the lease verbs (default automation: readers hold none).
        refresh_s: re-publication period while any lease is held [s].
        log: structlog logger; default ``rackplane.commands`` bound with the daemon name.

    Raises:
        ValueError: the lease verbs are already registered on ``router``.
    """

    STATE_THING: Final = "leases"

    def __init__(
        self,
        router: CommandRouter,
        table: LeaseTable,
        *,
        role: Role = "automation",
        refresh_s: float = 10.0,
        log: Any = None,
    ) -> None:
        self.router = router
        self.table = table
        self.refresh_s = float(refresh_s)
        self._log = log if log is not None else get_logger(LOGGER, daemon=router.link.daemon)
        self._dirty = True  # publish the initial (free) state once
        self._next_refresh = -math.inf
        self._last_now: float | None = None
        register_lease_verbs(router, table, on_change=self._changed, role=role)

    def check(self, output: str, ctx: CommandContext, *, require_lease: bool = False) -> None:
        """May the command's user move ``output`` now? (`LeaseTable.check` at
        ``ctx.now_mono``; interlocks first, then leases.) Call before mutating.

        Raises:
            CommandError: ``unknown_output``, ``interlock_active``, ``lease_held``,
                ``lease_required``.
        """
        self.table.check(output, ctx.user, ctx.role, ctx.now_mono, require_lease=require_lease)

    def tick(self, now: float, interlocks: Mapping[str, str] | None = None) -> None:
        """From the daemon's control tick: the interlocks holding outputs now (``None``
        keeps the previous set), lease expiry, one log event per change, and ``state/leases``
        when it changed (or every ``refresh_s`` while a lease is held). Never raises for a
        publication problem (logged)."""
        if interlocks is not None and dict(interlocks) != self.table.interlocks:
            before = self.table.interlocks
            self.table.set_interlocks(interlocks)
            after = self.table.interlocks
            if after != before:
                self._log.warning("lease_interlocks", active=after, previous=before,
                                  note="active interlocks override every lease")
                self._dirty = True
        self.table.expire(now)
        self._flush(now)

    def snapshot(self, now: float) -> dict[str, Any]:
        """The ``state/leases`` payload now (for a verb's ``get_state`` reply)."""
        return self.table.snapshot(now)

    def republish(self) -> None:
        """Publish ``state/leases`` at the next `tick` (a pair's instance that became
        active: its leases came by sync, without events)."""
        self._dirty = True

    def _changed(self, _table: LeaseTable) -> None:
        # A lease verb changed something: log it and publish at once (the command's time).
        now = self._last_now if self._last_now is not None else -math.inf
        self._dirty = True
        events = self.table.drain_events()
        for ev in events:
            now = max(now, ev.t_mono)
            self._log.info("lease", **ev.as_dict())
        if math.isfinite(now):
            self._publish(now)  # else (no time known yet): the next tick publishes it

    def _flush(self, now: float) -> None:
        for ev in self.table.drain_events():
            self._log.info("lease", **ev.as_dict())
            self._dirty = True
        held = any(self.table.holder(o, now) is not None for o in self.table.outputs)
        if self._dirty or (held and now >= self._next_refresh):
            self._publish(now)

    def _publish(self, now: float) -> None:
        self._last_now = now
        try:
            self.router.link.publish_state(self.STATE_THING, self.table.snapshot(now))
        except (TypeError, ValueError) as err:  # never for connectivity (MqttLink queues)
            self._log.error("lease_state_publish_failed", error=repr(err))
            return
        self._dirty = False
        self._next_refresh = now + self.refresh_s
