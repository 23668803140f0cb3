"""Node-agent telemetry load for the ingest benchmarks: the virtual racks' ``telemetry/trayNN``
payloads (`sims.row.VirtualRack`, `sims.telemetry.tray_payloads`) published with a bare
paho-mqtt client (the benchmarks' load generator is not the code under test).

Usage::

    python -m harness.benchkids.loadgen rate  HOST PORT N_RACKS RATE_MULT DURATION_S OUT_JSON
    python -m harness.benchkids.loadgen flood HOST PORT COUNT OUT_JSON

``rate``: every rack's 18 trays publish ``RATE_MULT`` times per wall second (1: the node agents'
1 Hz), each publish one more plant second of the rack, spread evenly over the second. The
payloads are generated and serialised before the clock starts, so the generator's cost does
not load the host during the measurement. ``flood``: rack1's trays, ``COUNT`` messages, as
fast as the client can write them; every message is a fresh one (each plant second of the rack
once, ``ts_ns`` and counters advancing, all generated before the clock starts), so a
subscriber that refuses duplicates does its full work on each. OUT_JSON gets the counts, the
samples per message (every numeric or boolean leaf of a payload) and the achieved rate.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho

from rackplane.settings import Identity
from sims.row import VirtualRack
from sims.telemetry import tray_payloads

WALL0_NS = 1_780_000_000 * 10**9


def count_samples(x: Any) -> int:
    """Numeric and boolean leaves of a JSON value (a sample each); strings and nulls are not."""
    if isinstance(x, dict):
        return sum(count_samples(v) for v in x.values())
    if isinstance(x, list):
        return sum(count_samples(v) for v in x)
    return 1 if isinstance(x, int | float) else 0


def frames(rack: int, n_seconds: int | None = None, *, n_messages: int | None = None
           ) -> tuple[list[list[tuple[str, bytes]]], int]:
    """``n_seconds`` plant seconds of rack ``rack`` (1-based) as (topic, payload) lists (one
    per tray and second), or with ``n_messages`` enough seconds for that many messages; and
    the samples per message of the first frame."""
    ident = Identity(rack=f"rack{rack}")
    vr = VirtualRack(seed=rack, fabric="on")
    if n_messages is not None:
        n_seconds = -(-n_messages // vr.compute.n_trays)
    assert n_seconds is not None
    vr.warm_start()
    base = f"rackplane/{ident.site}/{ident.rack}/sim/telemetry"
    out = []
    samples = 0
    for s in range(n_seconds):
        for _ in range(10):
            vr.step(0.1)
        pl = tray_payloads(vr, ident, WALL0_NS + s * 10**9)
        if s == 0:
            samples = sum(count_samples(p) for _, p in pl) // len(pl)
        out.append([(f"{base}/{thing}", json.dumps(p).encode()) for thing, p in pl])
    return out, samples


def _client(host: str, port: int, name: str) -> paho.Client:
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=name,
                    protocol=paho.MQTTv311)
    c.max_queued_messages_set(0)
    c.connect(host, port, keepalive=60)
    c.loop_start()
    deadline = time.monotonic() + 10
    while not c.is_connected() and time.monotonic() < deadline:
        time.sleep(0.01)
    return c


def _finish(c: paho.Client) -> None:
    time.sleep(0.5)
    c.disconnect()
    c.loop_stop()


def rate(host: str, port: int, n_racks: int, mult: int, duration_s: float, out: Path) -> None:
    n_sec = max(1, round(duration_s * mult))
    per_rack = [frames(r, n_sec) for r in range(1, n_racks + 1)]
    samples = per_rack[0][1]
    # message order: plant second s, then rack, then tray (each rack's trays spread evenly)
    msgs: list[tuple[str, bytes]] = []
    for s in range(n_sec):
        for r in range(n_racks):
            msgs += per_rack[r][0][s]
    del per_rack
    total_rate = len(msgs) / duration_s
    c = _client(host, port, f"bench-loadgen-{time.monotonic_ns()}")
    Path(str(out) + ".started").write_text("1")  # the measurement window starts now
    t0 = time.monotonic()
    published = 0
    late_max = 0.0
    for k, (topic, payload) in enumerate(msgs):
        due = t0 + k / total_rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        else:
            late_max = max(late_max, now - due)
        if c.publish(topic, payload, qos=0).rc == paho.MQTT_ERR_SUCCESS:
            published += 1
    wall = time.monotonic() - t0
    _finish(c)
    out.write_text(json.dumps({
        "published": published, "attempted": len(msgs), "wall_s": wall,
        "samples_per_message": samples, "messages_per_s": published / wall,
        "samples_per_s": published * samples / wall, "late_max_s": late_max,
        "t0_mono": t0}))


def flood(host: str, port: int, count: int, out: Path) -> None:
    # every flooded message is a distinct plant second of its tray (no duplicate for the
    # subscriber to refuse as stale): generated and serialised before the clock starts
    fr, samples = frames(1, n_messages=count)
    msgs = [m for f in fr for m in f]
    del fr
    c = _client(host, port, f"bench-flood-{time.monotonic_ns()}")
    t0 = time.monotonic()
    published = 0
    for k in range(count):
        topic, payload = msgs[k]
        if c.publish(topic, payload, qos=0).rc == paho.MQTT_ERR_SUCCESS:
            published += 1
    wall = time.monotonic() - t0
    _finish(c)
    out.write_text(json.dumps({"published": published, "wall_s": wall,
                               "samples_per_message": samples,
                               "messages_per_s": published / wall}))


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "rate":
        rate(argv[1], int(argv[2]), int(argv[3]), int(argv[4]), float(argv[5]), Path(argv[6]))
    elif mode == "flood":
        flood(argv[1], int(argv[2]), int(argv[3]), Path(argv[4]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
