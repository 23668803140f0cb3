"""The MQTT adapter. DESIGN §3, FIELD-CASES BR-22/24. A package: `rackplane.io.mqtt.link` is the
only module importing aiomqtt and paho; `rackplane.io.mqtt.queues` holds what the link keeps in
process (publish queues, subscriptions, dispatch); topic names, topic checks and `Message` are
pure (`rackplane.core.topics`).

One `MqttLink` per daemon owns one broker connection and keeps it up for the daemon's whole
life. It never makes the daemon depend on the broker: `run()` starts with no broker at all,
reconnects forever with a capped, jittered exponential backoff, and everything published while
disconnected is kept (state and alarms latest-wins per key, command replies and telemetry in
bounded FIFOs whose drops are counted and logged) and sent after the next connect.

Topics (DESIGN §3), ``<base> = <topic_root>/<site>/<rack>/<daemon>`` (the row is in payloads and
tags, not in the topic)::

    <base>/status                      retained, QoS 1: online / stopping; Last Will offline
    <base>/status/<instance>           the same for one instance of a redundant pair (``instance``)
    <base>/state/<thing>               retained JSON, QoS 1, latest wins, re-sent on every connect
    <base>/telemetry/<thing>           JSON, QoS 0, queued while disconnected (drop-oldest)
    <base>/alarm/<id>                  retained JSON, QoS 1 while active; empty retained = cleared
                                       (reconciled on every connect, see `MqttLink` "alarms")
    <base>/cmd/<user>/<verb>           incoming commands (subscribe to `Topics.cmd_filter`)
    <base>/cmd/<user>/<verb>/result    replies when the request has no MQTT v5 response topic

What the link guarantees (and how it is tested, tests/adapters/test_mqtt.py):

- Every registered subscription is re-sent on *every* successful connect, whatever the CONNACK's
  session-present flag says, so a broker restarted without persistence never leaves the daemon
  deaf (BR-22 b). `subscribed_topics` (filters granted on the current connection) equals
  `configured_topics` after each reconnect.
- Incoming messages are taken straight from paho's callback into an unbounded in-process FIFO
  that exists for the link's whole life, so messages a persistent session delivers right after
  CONNACK are never lost (aiomqtt#95, BR-22 a). One dispatcher task hands them to the handlers
  in arrival order and yields to the event loop whenever handlers ran 2 ms without a break
  (`_DISPATCH_SLICE_S`, BR-24 d). Nothing is ever discarded on the way in; the FIFO's depth
  and high-water mark are in `stats`.
- A handler exception is logged and counted (`stats.handler_errors`); dispatch goes on.
- On MQTT v5 a subscription may ask for Retain As Published (``subscribe(...,
  retain_as_published=True)``, MQTT 5.0 §3.8.3.1): the broker then keeps the RETAIN flag of a
  message delivered live, so a command *published* retained is seen as retained and refused
  even when it arrives on an established subscription. MQTT 3.1.1 has no such option: there a
  live delivery always carries RETAIN 0 (MQTT 3.1.1 §3.3.1.3) and only deliveries from the
  retained store (at subscribe time) are flagged (docs/COMMANDS.md, "Retained commands").
- ``announce=False`` makes a client link (the ``rackctl`` CLI): no ``status`` topic, no Will.
- Nothing here blocks the event loop: the TCP/TLS connect runs in a worker thread (aiomqtt),
  everything else is non-blocking socket I/O driven by the loop.

Library facts this module relies on (aiomqtt 2.5.1, paho-mqtt 2.2.0; pyproject pins aiomqtt
<2.6 because `_Client` overrides three private aiomqtt callbacks and reads its paho client to
reach the socket; tests/adapters/test_mqtt.py fails if any of that changes):

- aiomqtt's `Message` drops paho's DUP flag; `_Client._on_message` keeps it, so redeliveries
  surface with ``Message.dup = True``.
- aiomqtt ignores a connection closed before CONNACK and then waits the whole timeout in
  ``__aenter__``; `_Client._on_disconnect` fails the connect at once instead.
- aiomqtt's `_on_connect` drops the CONNACK session-present flag; `_Client._on_connect` keeps it.
- paho never sets TCP_NODELAY; we pass it as a socket option (TEST-SERVERS.md: worst-case
  latency ~42 ms without, 5-16 ms with, at 1 k msg/s).
- aiomqtt's `publish()` waits for paho's send callback even at QoS 0 (~2.5 k msg/s one at a
  time, TEST-SERVERS.md); the sender therefore keeps a batch of publishes in flight at once.
"""

from rackplane.core import topics as _topics
from rackplane.core.topics import *  # noqa: F403 (the package's public names: its modules' __all__)
from rackplane.io.mqtt import link as _link
from rackplane.io.mqtt import queues as _queues
from rackplane.io.mqtt.link import *  # noqa: F403 (the package's public names: its modules' __all__)
from rackplane.io.mqtt.queues import *  # noqa: F403 (the package's public names: its modules' __all__)

__all__: list[str] = []
__all__ += _topics.__all__
__all__ += _link.__all__
__all__ += _queues.__all__
