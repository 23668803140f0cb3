"""``[leadership]``: the leadership lease of a redundant controller pair (issue 15;
docs/OPERATIONS.md §6). Off by default: a single instance writes as it always has.

A pure pydantic model (no I/O library): `rackplane.daemon.DaemonFrame` reads it from a daemon
config that has a ``leadership`` section and runs the lease (`rackplane.io.nats.lease`).
"""

from __future__ import annotations

import os
import re

from pydantic import Field, field_validator, model_validator

from rackplane.config import StrictModel
from rackplane.core.leadership import JETSTREAM_ELECTION_MAX_S, LeaseTiming
from rackplane.core.names import PAIR_INSTANCE_PATTERN

__all__ = ["LeadershipSettings", "NatsKvSettings", "check_nats_servers"]

_SERVER = re.compile(r"^(nats|tls)://[A-Za-z0-9.\-\[\]:]+:([0-9]{1,5})$")


_LOOPBACK = frozenset({"localhost", "[::1]", "::1"})


def _host(server: str) -> str:
    """The host of a ``nats://host:port`` entry (already checked), lower case."""
    return server.split("://", 1)[1].rsplit(":", 1)[0].lower()


def check_nats_servers(servers: list[str]) -> list[str]:
    """Validate a NATS server list (``[leadership]``, racky's and rlc's ``[fleet]``): each
    ``nats://host:port`` or ``tls://host:port`` with a port in 1..65535, none named twice.

    Raises:
        ValueError: naming the first bad or repeated entry.
    """
    seen: set[str] = set()
    for s in servers:
        m = _SERVER.fullmatch(s)
        if not m:
            raise ValueError(f"server {s!r} is not nats://host:port or tls://host:port")
        if not 1 <= int(m.group(2)) <= 65535:
            raise ValueError(f"server {s!r}: port {int(m.group(2))} is outside 1..65535")
        if s in seen:
            raise ValueError(f"server {s!r} is listed twice (name every node of the cluster "
                             "once)")
        seen.add(s)
    return servers


class NatsKvSettings(StrictModel):
    """A connection to a NATS JetStream cluster and one of its KV buckets: the one shape of
    ``[leadership]`` and of racky's and rlc's ``[fleet]`` (each sets its bucket's name)."""

    servers: list[str] = Field(
        default_factory=lambda: ["nats://127.0.0.1:4222"], min_length=1, max_length=16,
        description="every node of the NATS cluster, nats://host:port")
    bucket: str = Field("rackplane_leases", pattern=r"^[A-Za-z0-9_-]{1,64}$",
                        description="the JetStream KV bucket (made when missing)")
    username: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="NATS user of this daemon (config/nats/authorization.conf: the daemon's "
        "name, e.g. 'valvey'); unset: connect without a user (a cluster without authorization)")
    password_env: str | None = Field(
        None, description="name of the env var holding the NATS user's password")
    replicas: int = Field(3, ge=1, le=5, description="the bucket's replicas (3: survives the "
                          "loss of any one node)")
    request_timeout_s: float = Field(1.0, gt=0, le=60, allow_inf_nan=False,
                                     description="a KV request not answered by then has an "
                                     "unknown outcome (re-read)")

    @field_validator("servers")
    @classmethod
    def _servers(cls, v: list[str]) -> list[str]:
        return check_nats_servers(v)

    def password(self) -> str | None:
        """The NATS user's password from ``password_env`` (None: no variable named; "" when
        it is unset: `password_env_check` refuses that at start)."""
        return os.environ.get(self.password_env, "") if self.password_env else None

    def password_env_check(self, section: str) -> dict[str, str | None]:
        """``{"<section>.password_env": var}`` for `rackplane.config.check_environment`."""
        return {f"{section}.password_env": self.password_env}


class LeadershipSettings(NatsKvSettings):
    """The lease and the NATS JetStream cluster it lives on. Timing relations (checked):
    ``renew_every_s < renew_deadline_s < lease_s``, ``renew_deadline_s > election_max_s``,
    ``retry_every_s <= renew_every_s``, ``request_timeout_s <= renew_every_s``,
    ``sync_min_interval_s <= renew_every_s`` (the sync record's heartbeat)."""

    enabled: bool = Field(False, description="run as one instance of a pair: actuator writes "
                          "only while holding the lease (false: single instance, as before)")
    instance: str = Field("a", pattern=PAIR_INSTANCE_PATTERN,
                          description="this instance's name in the pair, e.g. 'a' or 'b'")
    bucket: str = Field("rackplane_leases", pattern=r"^[A-Za-z0-9_-]{1,64}$",
                        description="the JetStream KV bucket of the leases (made when missing)")
    lease_s: float = Field(15.0, gt=0, le=600, allow_inf_nan=False,
                           description="a lease record unchanged this long (since received) "
                           "has expired: the standby takes over")
    renew_every_s: float = Field(2.0, gt=0, le=60, allow_inf_nan=False,
                                 description="the holder's renewal period")
    renew_deadline_s: float = Field(10.0, gt=0, le=600, allow_inf_nan=False,
                                    description="the holder stops writing this long after "
                                    "sending its last confirmed renewal (by its own clock)")
    retry_every_s: float = Field(0.5, gt=0, le=60, allow_inf_nan=False,
                                 description="re-read period while a request's outcome is "
                                 "unknown")
    election_max_s: float = Field(JETSTREAM_ELECTION_MAX_S, gt=0, le=600, allow_inf_nan=False,
                                  description="the longest JetStream leader election "
                                  "(2.9.10: 9 s); renew_deadline_s must exceed it")

    sync_min_interval_s: float = Field(
        0.25, gt=0, le=60, allow_inf_nan=False,
        description="the active writes its state record to the KV store on change at most "
        "this often (and at least every renew_every_s); the standby reads it this often")
    sync_dedup_entries: int = Field(
        256, ge=16, le=4096, description="command request-ids (with their replies) carried "
        "in the state record, the newest within the command TTL")
    sync_max_age_s: float = Field(
        10.0, gt=0, le=3600, allow_inf_nan=False,
        description="alarm standby_not_in_sync when the standby's last applied state record "
        "is older than this")
    renew_late_s: float = Field(
        1.0, gt=0, le=600, allow_inf_nan=False,
        description="alarm lease_renewals_late when the last lease renewal took longer")
    no_active_margin_s: float = Field(
        2.0, ge=0, le=600, allow_inf_nan=False,
        description="alarm no_active_controller when the standby sees no live lease for "
        "longer than lease_s + this")

    @model_validator(mode="after")
    def _relations(self) -> LeadershipSettings:
        self.timing()  # raises ValueError naming each broken relation
        if self.sync_min_interval_s > self.renew_every_s:
            raise ValueError(f"sync_min_interval_s ({self.sync_min_interval_s}) must be <= "
                             f"renew_every_s ({self.renew_every_s})")
        if self.request_timeout_s > self.renew_every_s:
            raise ValueError(f"request_timeout_s ({self.request_timeout_s}) must be <= "
                             f"renew_every_s ({self.renew_every_s})")
        return self

    def warnings(self) -> list[str]:
        """What ``--check-config`` prints (and the daemon logs at start) about a pair's
        servers: while enabled, a list of only loopback addresses (the default
        ``nats://127.0.0.1:4222`` included). Each host's loopback is its own machine: two
        instances reaching two separate NATS servers each hold their own lease, and both
        write. Fine only when each host runs a node of one cluster; name every node."""
        if not self.enabled:
            return []
        hosts = [_host(s) for s in self.servers]
        if all(h in _LOOPBACK or h.startswith("127.") for h in hosts):
            how = "left at its default" if "servers" not in self.model_fields_set else "set"
            return [f"leadership.servers is {how} {self.servers}: only loopback addresses. "
                    "Both instances of a pair must reach the same NATS cluster (two separate "
                    "servers would give each its own lease, and both would write): name "
                    "every node of the cluster"]
        return []

    def environment_checks(self) -> dict[str, str | None]:
        """Key paths of the env vars these settings name (for
        `rackplane.config.check_environment`): the NATS password while enabled (unset, the
        instance would retry its connection for ever and never take part in the pair)."""
        return self.password_env_check("leadership") if self.enabled else {}

    def timing(self) -> LeaseTiming:
        """The `LeaseTiming` of these settings.

        Raises:
            ValueError: a timing relation is broken.
        """
        return LeaseTiming(lease_s=self.lease_s, renew_every_s=self.renew_every_s,
                           renew_deadline_s=self.renew_deadline_s,
                           retry_every_s=self.retry_every_s,
                           election_max_s=self.election_max_s)
