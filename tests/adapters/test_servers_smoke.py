"""The test servers themselves start, answer and restart on the same port."""

import json
import socket
import time
import urllib.error
import urllib.request

from harness.servers import InfluxDB1, Mosquitto, VictoriaMetrics


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


def test_influxdb1_needs_the_1x_write_path_and_keeps_data_over_a_restart(
    influxdb1_private: InfluxDB1,
) -> None:
    """Debian's InfluxDB 1.6.7: no /api/v2/write (404: why tsdb.api = "v1" exists); /write
    stores; a restart on the same port keeps the data (the outage tests rely on it)."""
    srv = influxdb1_private
    srv.create_database("smoke")
    line = b"smoke,rack=r1 value_c=1.5 1767225600000000000\n"

    def post(path: str) -> int:
        req = urllib.request.Request(srv.url + path, data=line, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return err.code

    assert post("/api/v2/write?org=o&bucket=smoke&precision=ns") == 404
    assert post("/write?db=smoke&precision=ns") == 204
    port = srv.port
    srv.restart()
    assert srv.port == port
    res = srv.query('SELECT "value_c", "rack" FROM "smoke"', "smoke", epoch="ns")
    assert res["results"][0]["series"][0]["values"] == [[1767225600000000000, 1.5, "r1"]]
