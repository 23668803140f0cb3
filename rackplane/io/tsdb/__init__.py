"""Telemetry to InfluxDB through the disk spool (DESIGN §1, §3). A package: `influx` is the only
influxdb-client importer (line building, the sender), `writer` the `TelemetryWriter`, `replay`
the later replay.

Three parts:

- `point_line` builds one line of line protocol with ``influxdb_client.Point`` (escaping is the
  library's, never string formatting: FIELD-CASES BR-21). Numeric fields are floats unless
  declared integer (BR-19); None, NaN and Inf are never written (DESIGN §3: the caller writes
  ``<field>_quality`` instead).
- `TelemetryWriter`: ``write()`` is synchronous and cheap (one ``Point``, ~10-20 µs); lines wait
  in memory at most ``spool.append_interval_s`` (default 100 ms) and are then appended to the
  `rackplane.io.spool.Spool` in one ``os.write``. ``run()`` drains the spool to InfluxDB in
  batches, through the v2 write API (``/api/v2/write``) or, with ``tsdb.api = "v1"``, the 1.x
  one (``/write?db=&rp=&precision=ns``, HTTP Basic auth when a user is set), each request
  made synchronously in a daemon thread (never the batching API: BR-18), so the event loop
  never waits on the network and a hung request never holds up the process exit.
- `replay()` sends a spool or embedded store to an InfluxDB later (``rackctl replay``).

Delivery semantics (what a test can check):

- Lines still in memory (at most ``append_interval_s`` worth) are lost by a SIGKILL: at most
  once. Appended lines survive a SIGKILL; fsynced ones (every ``fsync_interval_s`` and at
  shutdown) survive a power loss.
- Spooled lines are delivered at least once, in order. A line is sent again only when the
  process dies (or ``close()`` gives up) after the database received its batch and before the
  cursor moved: at most one batch (``batch_lines``) per crash. InfluxDB stores a repeated point
  (same series and timestamp) once; VictoriaMetrics keeps both unless deduplication is on.
- Outcomes of a batch: 2xx → acked. 400/422 (e.g. "field type conflict", BR-19) → dropped,
  counted in ``rejected`` and logged with the field and line the server named; never retried
  (InfluxDB has stored the valid lines of a partial write: when its answer says
  ``dropped=N``, N lines count as rejected and the rest as sent). 413 → the batch is halved until it
  fits; a single line that is still too large is rejected. 401/403 (and any other 4xx, e.g.
  404 bucket not found) → a configuration problem: logged loudly, data kept, retried with
  backoff. 429, 5xx, connection errors and timeouts → data kept, retried with capped
  exponential backoff (``retry_initial_s`` × 2 up to ``retry_max_s``, jitter -20 %,
  ``Retry-After`` honoured up to the cap). The writer never gives up: the spool bound is the
  only limit.

Timestamps: ``clock.wall_ns()`` unless given. A timestamp outside 2020-01-01 .. 2100-01-01 (a
unit mistake such as seconds for ns, or an unsynchronised clock at boot) is never written as
it is, on every path into the spool and the database (``write``, lines read back from a spool
an older version wrote, ``replay``): restamped with its arrival time (default) or dropped,
per ``tsdb.ts_out_of_window``; counted in ``ts_out_of_window`` and logged when that state
changes (`rackplane.io.tsdb.timestamps`).

I/O pacing (append interval, fsync interval, backoff, stop budget) uses the event loop's time,
the clock ``asyncio.sleep`` and timeouts run on; the injected clock gives the timestamps.

Measured (influxdb-client 1.50.0, VictoriaMetrics 1.79.5, 2-core host): ``write()`` ~20-40 k
points/s (``Point`` dominates: ~18 µs for 4 tags and 2 fields); the writer drains the spool to
VictoriaMetrics at ~75 k lines/s (batch 1,000), ``replay`` at ~140-160 k lines/s. The async
client (``InfluxDBClientAsync``) would need aiohttp, not installed; the thread is not the limit.
"""


from rackplane.io.tsdb import influx as _influx
from rackplane.io.tsdb import replay as _replay
from rackplane.io.tsdb import timestamps as _timestamps
from rackplane.io.tsdb import writer as _writer
from rackplane.io.tsdb.influx import *  # noqa: F403 (the package's public names: its modules' __all__)
from rackplane.io.tsdb.replay import *  # noqa: F403 (the package's public names: its modules' __all__)
from rackplane.io.tsdb.timestamps import *  # noqa: F403 (the package's public names: its modules' __all__)
from rackplane.io.tsdb.writer import *  # noqa: F403 (the package's public names: its modules' __all__)

__all__: list[str] = []
__all__ += _influx.__all__
__all__ += _replay.__all__
__all__ += _timestamps.__all__
__all__ += _writer.__all__
