"""tray-agent's DCGM exporter source: the exporter's text format served over real HTTP (a
local http.server), parsed with prometheus-client's parser: label renames across exporter
versions, metric renames, repeated series (equal: one value; different: unknown), NaN, a broken
scrape (every GPU unknown, never the last values); read only (cap_enforceable false)."""

from __future__ import annotations

import http.server
import io
import json
import threading
from collections.abc import Iterator

import pytest
from rich.console import Console

from rackplane.core.tray_contract import convert_tray
from trayagent.core.caps import CapBook
from trayagent.core.payload import TrayInfo, tray_payload
from trayagent.dcgm import DcgmError, DcgmSource, parse_exporter_text

HOST = 'UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e5{g}",device="nvidia{g}",' \
    'modelName="NVIDIA B200",Hostname="tray03",DCGM_FI_DRIVER_VERSION="570.124.06"'


def _exporter_3x(gpus: int = 4, extra: str = "") -> str:
    """dcgm-exporter 3.x: labels gpu, UUID, device, modelName, Hostname."""
    lines = []
    for name, typ, val in (("DCGM_FI_DEV_POWER_USAGE", "gauge", "612.5"),
                           ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "123456789"),
                           ("DCGM_FI_DEV_GPU_TEMP", "gauge", "64"),
                           ("DCGM_FI_DEV_GPU_UTIL", "gauge", "87"),
                           ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "65540"),  # 0x10004
                           ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "gauge", "700"),
                           ("DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN", "gauge", "200"),
                           ("DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", "gauge", "1200"),
                           ("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF", "gauge", "1000")):
        lines += [f"# HELP {name} {name}.", f"# TYPE {name} {typ}"]
        lines += [f'{name}{{gpu="{g}",{HOST.format(g=g)}}} {val}' for g in range(gpus)]
    return "\n".join(lines) + "\n" + extra


class _Exporter:
    def __init__(self) -> None:
        self.body = _exporter_3x()
        self.status = 200
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = outer.body.encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()


@pytest.fixture
def exporter() -> Iterator[_Exporter]:
    e = _Exporter()
    yield e
    e.server.shutdown()
    e.server.server_close()


def test_every_figure_is_read_with_its_unit(exporter: _Exporter) -> None:
    src = DcgmSource(exporter.url, 2.0)
    assert src.open() == 4 and not src.cap_enforceable
    src.refresh()
    r = src.read(2, 14)
    assert (r.gpu, r.power_w, r.power_kind, r.energy_mj) == (14, 612.5, "average", 123456789)
    assert (r.temp_c, r.utilization, r.limit_w) == (64.0, 0.87, 700.0)
    assert r.reasons == ["sw_power_cap"] and r.unknown_reason_bits == 0x10000
    assert tuple(r.limits) == (200.0, 1200.0, 1000.0)
    assert r.errors == {}
    with pytest.raises(DcgmError, match="no cap can be set"):
        src.set_limit(2, 500.0)


def test_older_label_and_metric_names_are_understood() -> None:
    """dcgm-exporter 1.x / 2.x: ``uuid`` in lower case, the GPU only in ``device``; the
    throttle-reasons name before DCGM 3.3; the power-management limit before the enforced one
    was exported."""
    text = ('DCGM_FI_DEV_POWER_USAGE{device="nvidia3",uuid="GPU-x"} 500\n'
            'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{GPU="3",uuid="GPU-x"} 8\n'
            'DCGM_FI_DEV_POWER_MGMT_LIMIT{gpu="3",uuid="GPU-x"} 650\n'
            'DCGM_FI_DEV_GPU_TEMP{uuid="GPU-no-index"} 99\n')
    rows = parse_exporter_text(text)
    assert rows == {3: {"power_w": 500.0, "reasons": 8.0, "limit_w": 650.0}}


def test_repeated_series_equal_are_one_value_different_are_unknown() -> None:
    text = ('DCGM_FI_DEV_POWER_USAGE{gpu="0",pod="a"} 500\n'
            'DCGM_FI_DEV_POWER_USAGE{gpu="0",pod="b"} 500\n'
            'DCGM_FI_DEV_GPU_TEMP{gpu="0",pod="a"} 60\n'
            'DCGM_FI_DEV_GPU_TEMP{gpu="0",pod="b"} 61\n'
            'DCGM_FI_DEV_ENFORCED_POWER_LIMIT{gpu="0"} 700\n'
            'DCGM_FI_DEV_POWER_MGMT_LIMIT{gpu="0"} 900\n'  # the older name beside: ignored
            'DCGM_FI_DEV_GPU_UTIL{gpu="0"} NaN\n')
    row = parse_exporter_text(text)[0]
    assert row["power_w"] == 500.0 and row["limit_w"] == 700.0
    assert row["temp_c"] == "conflicting series (60, 61)"
    assert row["utilization_pct"] == "not finite (nan)"


def test_a_broken_scrape_makes_every_gpu_unknown_never_the_last_values(
        exporter: _Exporter) -> None:
    src = DcgmSource(exporter.url, 2.0)
    src.open()
    exporter.body = "DCGM_FI_DEV_POWER_USAGE{gpu=0} 5 6 7 not text\n"
    src.refresh()
    r = src.read(0, 0)
    assert r.power_w is None and "not the Prometheus text format" in r.errors["power_w"]
    exporter.body, exporter.status = "oops", 500
    src.refresh()
    assert "HTTP Error 500" in src.read(0, 0).errors["power_w"]
    exporter.status = 200
    exporter.body = _exporter_3x(gpus=2)
    src.refresh()
    assert src.read(1, 1).power_w == 612.5
    assert src.read(3, 3).errors["power_w"] == "GPU 3 not in the exporter's answer"
    bad = DcgmSource("http://127.0.0.1:1/metrics", 0.5)
    with pytest.raises(DcgmError, match="DCGM exporter"):
        bad.open()


def test_a_reasons_value_that_is_not_a_mask_is_unknown() -> None:
    src = DcgmSource("http://unused", 1.0)
    src._rows = parse_exporter_text('DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu="0"} 4.5\n'
                                    'DCGM_FI_DEV_POWER_USAGE{gpu="0"} -3\n')
    r = src.read(0, 0)
    assert r.reasons == [] and r.errors["reasons"] == "not a bit mask: 4.5"
    assert r.power_w == -3.0  # the payload builder refuses to publish it (below)


def test_a_dcgm_tray_is_published_as_not_cap_enforceable(exporter: _Exporter) -> None:
    src = DcgmSource(exporter.url, 2.0)
    src.open()
    src.refresh()
    gpus = [src.read(i, 12 + i) for i in range(4)]
    book = CapBook({3: 4}, 700.0)
    p = tray_payload(TrayInfo("lab", "row1", "rack01", 3, 0.0, 45.0), gpus, book.trays[3],
                     ts_ns=1, cap_expires_in_s=None, cap_enforceable=src.cap_enforceable)
    m = convert_tray(json.loads(json.dumps(p))).struct
    assert m.agent.cap_enforceable is False and m.agent.enforced_gpu_cap_w == 700.0


def test_dry_connect_reads_the_exporter(exporter: _Exporter) -> None:
    from trayagent.cli import dry_connect
    from trayagent.config import TrayAgentConfig

    cfg = TrayAgentConfig.model_validate({
        "agents": {"source": "dcgm", "trays": [{"tray": 3, "nvml_devices": [0, 1, 2, 3],
                                                "coolant_out_temp_c": 45.0}]},
        "dcgm": {"url": exporter.url}})
    buf = io.StringIO()
    assert dry_connect(cfg, Console(file=buf, width=400)) == 0
    out = buf.getvalue()
    assert "dcgm: 4 GPUs" in out
    assert "device 0 (tray 3 gpu 12): power_w=612.5 (average)" in out
    exporter.body = _exporter_3x(gpus=3)
    assert dry_connect(cfg, Console(file=io.StringIO())) == 1  # a configured GPU missing
