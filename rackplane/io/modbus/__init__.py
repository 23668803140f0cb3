"""Modbus TCP acquisition: one owner task per device (DESIGN §1 bulkheads); devices at one
address (a gateway's host:port, a serial port) share one connection (`ModbusLinks`,
`rackplane.io.modbus.link`), each unit with its own bulkhead (`rackplane.io.modbus.bulkhead`).

This is the only daemon-side module importing pymodbus (3.16.x). Everything the library
raises is turned into `rackplane.errors` types here; decode, encode and read planning are the
pure functions of `rackplane.core.registers`.

`ModbusDevice.run()` is the owner task. It connects with capped, jittered exponential backoff,
polls on a fixed-rate schedule of the monotonic clock, reads the planned blocks, and hands
one `Sample` per configured point per poll to ``on_samples``: GOOD, or not GOOD with a reason.
Writes and dry reads are queued to it, so one client serialises every request.

Field behaviour (FIELD-CASES):

- BR-03: pymodbus 3.16.1 skips a reply whose transaction id differs from the request's, but
  it *accepts a reply with tid 0 for any request*, never checks the function code or byte
  count (a 1-register reply is returned for a 3-register read; an FC01 reply for an FC04
  request), does not check the unit id when the request went to unit 0, and drops the whole
  receive buffer once it holds more than 264 bytes (a late 125-register reply followed by the
  right one in the same TCP chunk: both lost, a timeout). This module installs a strict framer
  in the client: a reply is accepted only when tid, unit id, function code and byte count
  (or write echo) all match the outstanding request; anything else is dropped and counted
  (``stats.stale_frames``: other tid or no request outstanding; ``stats.rejected_frames``:
  right tid, wrong content). A broken MBAP header (protocol id != 0, impossible length) is a
  desync: the request times out and the connection is replaced. pymodbus wraps tids
  65000 -> 1 (never 0).
- BR-04: exception responses never escape the owner task. 2 -> the read plan is split and the
  split remembered, a single point answering 2 is BAD ``illegal_data_address``; 3 -> the
  request size shrinks (remembered); 6 -> the block's points are STALE ``server_busy`` this
  cycle (no invalid state, retried next cycle); 10/11 -> the unit is unavailable
  (``stats.available``), its points STALE, the TCP connection kept (the gateway is fine),
  and it is re-probed every ``dormant_reprobe_s`` only (issue 14). A single point answering
  2 or 3 is refused: BAD with that reason and not read before ``refused_reprobe_s``.
- RTU (serial, or through a transparent gateway): ``local_echo`` echo checked and discarded,
  input between requests dropped, t3.5 silence before each request on a serial line
  (`rackplane.io.modbus.rtu_line`).
- BR-05: no request exceeds 125 registers or the device's remembered limit.
- BR-06: unit 0 over TCP is an ordinary device (reads wait for the reply, its unit id is
  checked). With ``framer = "rtu"`` unit 0 is broadcast: writes are sent with pymodbus'
  ``no_response_expected`` (return at once, logged "no response expected"); reads are refused.
- BR-07: a timeout or connection loss makes every point STALE from that poll on (values read
  and validated earlier in the same poll stay GOOD: they are fresh), drops the connection and
  reconnects with a *new* client object: no byte of the old connection can be read again.
  On a shared connection a timeout is the unit's alone (the connection is kept, see
  `rackplane.io.modbus.link`); only a transport error, or every unit silent, replaces it.
  Backoff doubles from ``reconnect_min_s`` (floored at `MIN_RECONNECT_DELAY_S`) to
  ``reconnect_max_s`` with jitter in [d/2, d]; it resets only after a successful read, so a
  half-open device that accepts TCP but never answers keeps backing off. Only a live
  connection is dropped and rescheduled: a request refused while disconnected never touches
  the reconnect schedule or the backoff (field bug: a heartbeat write refused every second
  re-armed a 1-2 s delay each time, so the device never reconnected).
- A connection the device closes while idle (reboot, gateway idle timeout) is reopened at
  once if it had worked, so it costs no STALE poll. A connection lost *during* a request
  costs that request's timeout (pymodbus 3.16.1 does not fail the pending request on close).
- Shutdown: Python 3.11's ``asyncio.wait_for``, used by pymodbus for every request, swallows a
  cancel that arrives together with the reply (CPython gh-86296); the owner re-raises it from
  `asyncio.Task.cancelling`, so cancelling `ModbusDevice.run` always stops it.

Logging: state changes once per change (``modbus_offline`` / ``modbus_online`` once per outage
however many reconnects it takes, unit unavailable/available, a point becoming invalid and
recovering, a read plan change, a probable word-order error, a point's writes failing
(``modbus_write_failed``, again only when the reason changes) and succeeding again
(``modbus_write_recovered``), an internal error and its end); each connect attempt, close and
successful write is a debug line (a heartbeat is written every second). Every failure is
counted in `ModbusStats` however often it is logged. pymodbus' own per-event log lines (every
timeout, every skipped frame, each with a hex dump) are silenced by raising the ``pymodbus``
logger to CRITICAL, since every such event is reported here as a typed error, a counter or a
state change.

The injected `Clock` must advance in real time (`SystemClock`): it schedules polls and
reconnects and stamps samples; asyncio waits on it. Sample values are floats: 64-bit integer
points above 2**53 lose precision.

Cost (issue 8, ``bench.modbus.cost_ratio_to_raw``: CPU per poll vs the bare pymodbus client
on the same requests): each read request of the plan is prepared once per plan
(`_ReadOp`: its `rackplane.core.registers.BlockDecoder`, expected reply and client method) and
sent by one coroutine (`_read`) with the reply checks of its common case inline; the strict
framer builds the reply to a register read itself when the buffer holds exactly that reply
(pymodbus' generic PDU decode formats a debug string per reply even with logging off); a
poll in which every planned request answers collects its samples in plan order and puts
them in map order with an index computed per plan; the request guard is one lazily
re-armed timer (`_RequestWatchdog`), not an ``asyncio.timeout`` per request; the idle wait
is a bare future; the running loop and task are looked up once per poll (each lookup is a
getpid() system call). Every other case (exception replies, plan changes, stray or
mismatched frames, failures) takes the general path. Measured on the CDU map (35 points,
6 requests) at 10 Hz: 0.97-1.05x the bare client (median of 3 per run, 5 runs; the code
before, in runs alternated with them: 1.10-1.25x).
"""


from rackplane.io.modbus import device as _device
from rackplane.io.modbus import link as _link
from rackplane.io.modbus import support as _support
from rackplane.io.modbus.device import *  # noqa: F403 (the package's public names: its modules' __all__)
from rackplane.io.modbus.link import *  # noqa: F403
from rackplane.io.modbus.support import *  # noqa: F403 (the package's public names: its modules' __all__)

__all__: list[str] = []
__all__ += _device.__all__
__all__ += _link.__all__
__all__ += _support.__all__
