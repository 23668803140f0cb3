"""The test servers themselves start, answer and restart on the same port."""

import json
import socket
import time
import urllib.request

from harness.servers import Mosquitto, VictoriaMetrics


def test_mosquitto_restarts_on_same_port(mosquitto_private: Mosquitto) -> None:
    port = mosquitto_private.port
    mosquitto_private.restart()
    assert mosquitto_private.port == port
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


def test_victoria_accepts_influx_v2_line_protocol(victoria: VictoriaMetrics) -> None:
    tag = f"smoke{time.monotonic_ns()}"
    req = urllib.request.Request(
        victoria.url + "/api/v2/write?org=o&bucket=b&precision=ns",
        data=f"smoke,rack={tag} value_c=1.5 1767225600000000000\n".encode(),
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 204
    series = victoria.wait_export(f'{{__name__="smoke_value_c",rack="{tag}"}}')
    assert series[0]["values"] == [1.5]
    assert json.dumps(series[0]["metric"]["rack"]) == json.dumps(tag)
