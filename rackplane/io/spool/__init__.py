"""The on-disk telemetry spool: append-only segment files of InfluxDB line protocol (DESIGN §1).

Every telemetry line goes through this spool before the network; with no database configured
it *is* the embedded store. Pure file I/O: this module imports no database client.

Layout of ``directory``::

    seg-0000000000000001.lp   segments, oldest first; each starts with the header line
    seg-0000000000000002.lp   ``# rackplane-spool v1`` followed by complete lines only
    cursor                    the read cursor {segment, offset}: everything before it is acked
    .lock                     flock held by the one process that owns the spool (its pid inside)

Guarantees and policies:

- **Append** writes whole lines to the OS with ``os.write`` at once: a SIGKILL of the process
  loses nothing that was appended (the page cache survives the process). ``fsync()`` makes it
  survive a power loss too; the writer calls it every ``fsync_interval_s`` and at shutdown.
- **Complete lines only.** A torn last line (crash or power loss in the middle of a write, or
  NUL bytes a file system leaves after a power loss) is cut off when the spool is opened
  (counted in ``repaired_bytes``). A failed write (disk full) is truncated back before the error
  is raised, so a segment never holds a partial line.
- **Versioned.** Every segment and the cursor file carry the format version; a spool written
  by another format version is refused with a `SpoolError` naming both versions, never
  misread (an upgrade or a rollback fails clearly).
- **Cursor.** ``read(max_lines)`` returns lines from the acked position and the cursor just
  after them; ``ack(cursor)`` moves the persisted cursor there and deletes segments that are
  wholly acked. The cursor file has two slots (sequence number + CRC each) written
  alternately, so a write torn by a crash leaves the previous position intact: the update is
  atomic. A restart resumes exactly where acks stopped. Delivery through the spool is
  at-least-once: a crash between the database's 2xx and the cursor write resends that one
  batch.
- **Bound** (``max_bytes``): when the segments together exceed it, the *oldest* segments are
  removed, newest data kept (as Telegraf drops its oldest metrics; the most recent data is the
  one that explains an incident). Lines removed before they were acked are counted in
  ``dropped_by_bound`` and logged; in embedded mode (no database) this is the store's rotation.
  A batch read but not yet acked when its segment is removed may still be delivered; it is
  counted as dropped all the same.
- **Rotation** at ``segment_bytes``: a segment is never grown past it, except by one line
  that alone is longer.
- **Errors**: disk full, unwritable or unreadable files raise `SpoolError` (never an
  ``OSError``); the caller counts and reports them. Invalid input (empty line, embedded
  newline) raises ``ValueError``.

Threading: one thread (the event loop) uses a spool; ``fsync()`` alone may run in another
thread at the same time (it syncs duplicated descriptors), so a slow disk never stalls the loop.

Cost (measured on the 2-core test host, ext4, 130-byte lines): ``append`` ~88 k lines/s one
line a call, ~1.1-1.4 M lines/s in batches of 100-1,000 (one ``os.write`` a batch);
``read(1000)`` + ``ack`` ~575 k lines/s (a cursor write is one ``pwrite``); opening a full
500 MiB spool (counting its lines) ~0.5 s.
"""


from rackplane.io.spool import format as _format
from rackplane.io.spool import store as _store
from rackplane.io.spool.format import *  # noqa: F403 (the package's public names: its modules' __all__)
from rackplane.io.spool.store import *  # noqa: F403 (the package's public names: its modules' __all__)

__all__: list[str] = []
__all__ += _format.__all__
__all__ += _store.__all__
