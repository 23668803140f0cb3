"""NATS permissions generated from the shipped Mosquitto ACL, so the two cannot drift (issue 15
item 3).

Input: ``config/mosquitto/rackplane.acl`` (Mosquitto 2.0 ``acl_file``: ``pattern read T``
lines for every user, ``user U`` then ``topic read|write|readwrite T`` lines for U; DESIGN §3,
the roles in that file's header). Output: ``config/nats/rackplane-permissions.conf``, one
nats-server config variable per role, included by ``config/nats/authorization.conf`` (the
site's user list):

- ``RACKPLANE_PERMS_<USER>`` for every ``user`` block of the ACL: publish = its write grants,
  subscribe = its read grants plus the patterns; daemons that run as a pair (`LEASE_DAEMONS`)
  also get their own keys of the lease bucket (`lease_grants`).
- ``RACKPLANE_PERMS_READER``: the patterns only (subscribe), no publish at all.
- rlc (`FLEET_WRITER`) also gets the fleet bucket's budget keys (`fleet_writer_grants`).

And from rlc's topology (``config/rlc.example.toml``'s ``[topology]``: site and racks) the
fleet file ``config/nats/fleet-permissions.conf``: one whole NATS user per rack,
``RACKPLANE_FLEET_USER_<SITE>_<RACK>``, named `fleet_rack_user` (``racky-<site>-<rack>``,
racky's ``[fleet] username``), its password from ``$RACKPLANE_NATS_PASSWORD_<SITE...>``
(`password_var`), its grants `fleet_rack_grants`: that rack's keys of the fleet bucket only
(write its report ``<site>.<rack>.rack``, hear its lease ``<site>.<rack>.budget``); the
site's authorization.conf lists each variable. A per-rack user is what makes "another rack's
keys are refused" hold: NATS config users have no templates. Not restrictable by subject:
reads (the JetStream API's ``STREAM.MSG.GET`` names the key in its body, not its subject), so
any fleet user may read any rack's budget and report (none of it is secret); writes and
pushes are per rack.

Topic → subject (the NATS MQTT listener's mapping, nats-server 2.9.10): ``/`` ↔ ``.``, ``+`` ↔
``*``, ``#`` ↔ ``>``; a trailing ``/#`` also matches its parent level in MQTT, so it gives
both ``x`` and ``x.>``. Differences from Mosquitto that the mapping cannot remove (documented
in docs/OPERATIONS.md §6): NATS checks a SUBSCRIBE against the grants (Mosquitto accepts it
and filters each message), so a reader subscribes to the granted filters, not to
``rackplane/#``; NATS knows only the users its config lists (Mosquitto's "readers need no
lines" becomes "readers get ``$RACKPLANE_PERMS_READER``").

Run ``python -m rackplane.natsacl --write`` after editing the ACL or the topology (a site
passes its own: ``--rlc-config /etc/rackplane/rlc.toml``); tests/unit/test_natsacl.py fails
while the shipped files differ from what this module generates.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACL_PATH = ROOT / "config" / "mosquitto" / "rackplane.acl"
OUT_PATH = ROOT / "config" / "nats" / "rackplane-permissions.conf"
FLEET_PATH = ROOT / "config" / "nats" / "fleet-permissions.conf"
RLC_CONFIG_PATH = ROOT / "config" / "rlc.example.toml"
# Daemons that may run as a pair and so need the lease bucket (`[leadership]`).
LEASE_DAEMONS = ("valvey", "racky", "rlc")
LEASE_BUCKET = "rackplane_leases"
# The fleet bucket (rlc's and racky's [fleet] bucket) and the one user that writes budgets.
FLEET_BUCKET = "rackplane_fleet"
FLEET_WRITER = "rlc"
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# nats-server 2.9.10 delivers an MQTT QoS 1 subscription through a JetStream consumer whose
# delivery subject "$MQTT.sub.<nuid>" the client's own permissions must allow (measured: the
# SUBSCRIBE fails with "Unable to create subscription for JetStream consumer ... subscribe
# permission violation"; implicit only from nats-io/nats-server#7637, 2025). Every role gets
# it; users that connect by MQTT only have allowed_connection_types = ["MQTT"] in
# authorization.conf, so no NATS-native client of theirs can subscribe to other users'
# deliveries there.
MQTT_QOS1_DELIVERY = "$MQTT.sub.>"


class AclError(ValueError):
    """A line of the Mosquitto ACL this module does not understand (nothing is guessed)."""


@dataclass
class Grants:
    """One user's (or the patterns') grants as MQTT topic filters."""

    read: list[str] = field(default_factory=list)
    write: list[str] = field(default_factory=list)


@dataclass
class Acl:
    """The parsed ACL: ``patterns`` (every user), ``users`` (name → own grants, file order)."""

    patterns: Grants
    users: dict[str, Grants]


def parse_acl(text: str) -> Acl:
    """Parse a Mosquitto ACL of ``pattern``/``user``/``topic`` lines (comments, blanks skipped).

    Raises:
        AclError: an unknown keyword or access, a ``topic`` before any ``user``, a pattern
            with ``%u``/``%c`` (not expressible as a fixed NATS grant), a bad user name.
    """
    patterns = Grants()
    users: dict[str, Grants] = {}
    current: Grants | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        kind = words[0]
        if kind == "user" and len(words) == 2:
            if not _NAME_RE.fullmatch(words[1]):
                raise AclError(f"line {n}: user name {words[1]!r}")
            current = users.setdefault(words[1], Grants())
            continue
        if kind not in ("pattern", "topic") or len(words) not in (2, 3):
            raise AclError(f"line {n}: {line!r}")
        access, topic = (words[1], words[2]) if len(words) == 3 else ("readwrite", words[1])
        if access not in ("read", "write", "readwrite", "deny"):
            raise AclError(f"line {n}: access {access!r}")
        if access == "deny":
            raise AclError(f"line {n}: deny lines are not translated")
        if "%" in topic:
            raise AclError(f"line {n}: {topic!r}: %u/%c patterns are not translated")
        target = patterns if kind == "pattern" else current
        if target is None:
            raise AclError(f"line {n}: topic before any user")
        if access in ("read", "readwrite"):
            target.read.append(topic)
        if access in ("write", "readwrite"):
            target.write.append(topic)
    return Acl(patterns, users)


def topic_to_subjects(topic: str) -> list[str]:
    """The NATS subjects equivalent to one MQTT topic filter (``a/+/#`` → ``a.*``, ``a.*.>``).

    Raises:
        AclError: a level with ``.`` or a space (the MQTT listener disconnects such clients),
            an empty level, or a wildcard inside a level.
    """
    levels = topic.split("/")
    out = []
    for i, lv in enumerate(levels):
        if not lv or "." in lv or " " in lv or ("#" in lv and (lv != "#" or i != len(levels) - 1)) \
                or ("+" in lv and lv != "+") or lv in ("*", ">"):
            raise AclError(f"topic {topic!r}: level {lv!r} has no NATS equivalent")
        out.append({"+": "*", "#": ">"}.get(lv, lv))
    subject = ".".join(out)
    if levels[-1] == "#" and len(levels) > 1:
        return [".".join(out[:-1]), subject]
    return [subject]


def lease_grants(daemon: str, bucket: str = LEASE_BUCKET) -> Grants:
    """A pair daemon's grants on the lease bucket (rackplane.io.nats.kv, rackplane.pair): its
    own keys ``<site>.<rack>.<daemon>`` and ``.<daemon>.probe``/``.sync`` (write and read);
    the JetStream API requests the adapter makes on that bucket's stream only (open or make
    it, its info, reads); replies on its own inbox prefix ``_INBOX_<daemon>``
    (`rackplane.io.nats.kv.inbox_prefix`)."""
    stream = f"KV_{bucket}"
    keys = [f"$KV.{bucket}.*.*.{daemon}", f"$KV.{bucket}.*.*.{daemon}.>"]
    return Grants(
        read=[*keys, f"_INBOX_{daemon}.>"],
        write=[*keys, f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.STREAM.CREATE.{stream}",
               f"$JS.API.STREAM.MSG.GET.{stream}"],
    )


def _stream_api(bucket: str, *, create: bool) -> list[str]:
    stream = f"KV_{bucket}"
    return [f"$JS.API.STREAM.INFO.{stream}",
            *([f"$JS.API.STREAM.CREATE.{stream}"] if create else []),
            f"$JS.API.STREAM.MSG.GET.{stream}"]


def fleet_writer_grants(bucket: str = FLEET_BUCKET) -> Grants:
    """rlc's grants on the fleet bucket (`rackplane.core.budget_leases`): write every rack's
    budget key ``<site>.<rack>.budget`` (create and compare-and-set), open or make the
    bucket, read any key (the racks' reports). Replies: its lease grants' inbox."""
    return Grants(read=[],
                  write=[f"$KV.{bucket}.*.*.budget", *_stream_api(bucket, create=True)])


def fleet_rack_user(site: str, rack: str) -> str:
    """The NATS user of ``rack``'s racky on the fleet bucket: ``racky-<site>-<rack>``.

    Raises:
        AclError: a site or rack name that is not ``[A-Za-z0-9_-]`` (no NATS user name).
    """
    user = f"racky-{site}-{rack}"
    if not _NAME_RE.fullmatch(user) or not site or not rack:
        raise AclError(f"site {site!r} / rack {rack!r}: no NATS user name ({_NAME_RE.pattern})")
    return user


def password_var(user: str) -> str:
    """The environment variable of ``user``'s password in authorization.conf:
    ``RACKPLANE_NATS_PASSWORD_<USER>`` (upper case, ``-`` as ``_``)."""
    return "RACKPLANE_NATS_PASSWORD_" + user.upper().replace("-", "_")


def fleet_rack_grants(site: str, rack: str, bucket: str = FLEET_BUCKET) -> Grants:
    """One rack's racky on the fleet bucket (`racky.fleet`): write its report
    ``<site>.<rack>.rack`` (plain put), hear its lease ``<site>.<rack>.budget`` as written (a
    plain subscription), open the bucket (never make it: rlc does) and read keys; replies on
    its own inbox prefix. Nothing of another rack."""
    user = fleet_rack_user(site, rack)
    return Grants(read=[f"$KV.{bucket}.{site}.{rack}.budget", f"_INBOX_{user}.>"],
                  write=[f"$KV.{bucket}.{site}.{rack}.rack", *_stream_api(bucket, create=False)])


EXAMPLE_MARK = "# [topology]"
"""The line that opens the shipped example's commented-out ``[topology]`` (rlc requires the
operator's own; ``rlc --print-default-config`` writes its example commented)."""


def _commented_example(text: str) -> str | None:
    """The commented-out ``[topology]`` block after `EXAMPLE_MARK`, uncommented (None: none)."""
    lines = text.splitlines()
    if EXAMPLE_MARK not in lines:
        return None
    block = []
    for ln in lines[lines.index(EXAMPLE_MARK):]:
        if not ln.startswith("#"):
            break
        block.append(ln[2:] if ln.startswith("# ") else ln[1:])
    return "\n".join(block) + "\n"


def fleet_racks(rlc_config_text: str) -> tuple[str, list[str]]:
    """(site, racks in file order) of an rlc config's ``[topology]`` (TOML, read as data: the
    generator does not import rlc); a file without an active ``[topology]`` but with the
    shipped example's commented one (`EXAMPLE_MARK`: config/rlc.example.toml) gives that
    example's.

    Raises:
        AclError: no ``[topology]`` with a site and at least one rack, or a rack named twice.
    """
    try:
        data = tomllib.loads(rlc_config_text)
        if "topology" not in data and (example := _commented_example(rlc_config_text)):
            data = tomllib.loads(example)
        topo = data["topology"]
        site = str(topo["site"])
        racks = [str(r) for hall in topo["halls"].values() for row in hall["rows"].values()
                 for r in row["racks"]]
    except (KeyError, TypeError, AttributeError, tomllib.TOMLDecodeError) as err:
        raise AclError(f"rlc config: no [topology] with site, halls, rows, racks ({err!r})"
                       ) from None
    if not racks or len(set(racks)) != len(racks):
        raise AclError(f"rlc config: racks {racks} (none, or one named twice)")
    return site, racks


def _subjects(topics: list[str]) -> list[str]:
    out: list[str] = []
    for t in topics:
        for s in topic_to_subjects(t):
            if s not in out:
                out.append(s)
    return out


def _block(name: str, publish: list[str], subscribe: list[str]) -> str:
    def lst(items: list[str]) -> str:
        return "[\n" + "".join(f'      "{s}"\n' for s in items) + "    ]"

    pub = f"  publish: {{ allow: {lst(publish)} }}\n" if publish else \
        '  publish: { deny: ">" }\n'
    return f"{name} = {{\n{pub}  subscribe: {{ allow: {lst(subscribe)} }}\n}}\n"


def render(acl: Acl, lease_daemons: tuple[str, ...] = LEASE_DAEMONS,
           bucket: str = LEASE_BUCKET, fleet_bucket: str = FLEET_BUCKET) -> str:
    """The permissions file's text for ``acl`` (deterministic: ACL order)."""
    parts = [
        "# GENERATED by `python -m rackplane.natsacl --write` from\n"
        "# config/mosquitto/rackplane.acl:\n"
        "# do not edit (tests/unit/test_natsacl.py compares). Included by authorization.conf.\n"
        "# One variable per role: RACKPLANE_PERMS_<USER> for each user of the ACL,\n"
        "# RACKPLANE_PERMS_READER for every other user (read status/state/alarm/telemetry).\n\n"
    ]
    reads = _subjects(acl.patterns.read)
    parts.append(_block("RACKPLANE_PERMS_READER", [], [*reads, MQTT_QOS1_DELIVERY]))
    for user, g in acl.users.items():
        extra = lease_grants(user, bucket) if user in lease_daemons else Grants()
        if user == FLEET_WRITER:
            fw = fleet_writer_grants(fleet_bucket)
            extra = Grants(extra.read + fw.read, extra.write + fw.write)
        sub = (_subjects(g.read) + [s for s in reads if s not in _subjects(g.read)]
               + extra.read + [MQTT_QOS1_DELIVERY])
        parts.append("\n" + _block(f"RACKPLANE_PERMS_{user.upper().replace('-', '_')}",
                                   _subjects(g.write) + extra.write, sub))
    return "".join(parts)


def render_fleet(site: str, racks: list[str], bucket: str = FLEET_BUCKET) -> str:
    """The fleet file's text: one user variable per rack (module docstring).

    Raises:
        AclError: a site or rack name that cannot be a NATS user (`fleet_rack_user`).
    """
    parts = [
        "# GENERATED by `python -m rackplane.natsacl --write` from rlc's topology\n"
        "# (--rlc-config; shipped: config/rlc.example.toml's commented example): do not edit\n"
        "# (tests/unit/test_natsacl.py compares). Included by authorization.conf, whose users\n"
        "# list names each variable. One NATS user per rack for racky's [fleet] connection\n"
        f"# (username racky-<site>-<rack>): that rack's keys of the {bucket} bucket only.\n"
    ]
    for rack in racks:
        user = fleet_rack_user(site, rack)
        g = fleet_rack_grants(site, rack, bucket)
        inner = _block("permissions", g.write, g.read).rstrip("\n").replace("\n", "\n  ")
        parts.append(
            f"\n{fleet_user_var(site, rack)} = {{\n  user: \"{user}\"\n"
            f"  password: ${password_var(user)}\n  {inner}\n}}\n")
    return "".join(parts)


def fleet_user_var(site: str, rack: str) -> str:
    """The fleet file's variable of one rack's user (authorization.conf lists it)."""
    return "RACKPLANE_FLEET_USER_" + fleet_rack_user(site, rack)[len("racky-"):].upper(
        ).replace("-", "_")


def main(argv: list[str] | None = None) -> int:
    """``--write``: (re)write the permissions and fleet files; ``--check``: exit 1 when
    either differs."""
    ap = argparse.ArgumentParser(prog="python -m rackplane.natsacl", description=__doc__)
    ap.add_argument("--acl", type=Path, default=ACL_PATH)
    ap.add_argument("--out", type=Path, default=OUT_PATH)
    ap.add_argument("--rlc-config", type=Path, default=RLC_CONFIG_PATH,
                    help="rlc's config: its [topology] names the site and racks")
    ap.add_argument("--fleet-out", type=Path, default=FLEET_PATH)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--bucket", default=LEASE_BUCKET,
                    help="the lease bucket ([leadership] bucket) the daemons may use")
    ap.add_argument("--fleet-bucket", default=FLEET_BUCKET,
                    help="the fleet bucket (rlc's and racky's [fleet] bucket)")
    a = ap.parse_args(argv)
    texts = {
        a.out: render(parse_acl(a.acl.read_text()), bucket=a.bucket,
                      fleet_bucket=a.fleet_bucket),
        a.fleet_out: render_fleet(*fleet_racks(a.rlc_config.read_text()), a.fleet_bucket),
    }
    if a.write:
        for path, text in texts.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return 0
    if a.check:
        stale = [p for p, t in texts.items() if not (p.exists() and p.read_text() == t)]
        for p in stale:
            print(f"{p} differs from what {a.acl} and {a.rlc_config} generate: run "
                  "python -m rackplane.natsacl --write", file=sys.stderr)
        return 1 if stale else 0
    sys.stdout.write("".join(texts.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
