"""``rackctl demo --broker`` with a broker that is not there (issue 14 item 16): said at once,
clearly, and the demo ends cleanly (no live view of dashes, no traceback, no TypeError)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness.demo import DemoSummary, summary_markdown
from harness.servers import free_port
from rackctl.cli import EXIT_NO_BROKER


@pytest.mark.parametrize("target", ["closed_port", "port_1", "unknown_host"])
def test_unreachable_broker_is_said_at_once_and_the_demo_ends_cleanly(
        tmp_path: Path, target: str) -> None:
    broker = {"closed_port": f"127.0.0.1:{free_port()}", "port_1": "127.0.0.1:1",
              "unknown_host": "no-such-broker.invalid:1883"}[target]
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "rackctl", "demo", "--broker", broker, "--duration", "30",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    out = r.stdout + r.stderr
    assert r.returncode == EXIT_NO_BROKER, out
    assert "unreachable" in out and broker.rsplit(":", 1)[0] in out, out
    assert "Traceback" not in out and "TypeError" not in out, out
    assert time.monotonic() - t0 < 25  # never ran the 30 s with nothing to show
    assert not (tmp_path / "out").exists()  # nothing was started


def test_a_listening_socket_passes_the_probe() -> None:
    import asyncio

    from harness.demo import probe_broker

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    try:
        asyncio.run(probe_broker("127.0.0.1", srv.getsockname()[1]))
    finally:
        srv.close()


def test_summary_of_a_run_that_saw_nothing_is_written() -> None:
    """No plant data (the broker went away): the Markdown summary has dashes, never raises."""
    s = DemoSummary(scenario="load-step", duration_s=0.0, steps=[], points_spooled=0,
                    spool_dir="spool", valvey_exit_code=0, alarms_raised=[], plot=None,
                    trace_csv="trace.csv", run_dir=".", max_gpu_tj_c=None,
                    broker_problem="NOT CONNECTED")
    text = summary_markdown(s)
    assert "Hottest GPU junction: —" in text


@pytest.mark.slow
def test_broker_lost_mid_run_is_said_and_the_summary_is_written(
        tmp_path: Path, mosquitto_private: Any) -> None:
    """The real Mosquitto goes away during the run: the demo says so (not dashes), ends at
    its duration and writes its summary naming the problem."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rackctl", "demo", "--racks", "1", "--broker",
         f"{mosquitto_private.host}:{mosquitto_private.port}", "--duration", "14",
         "--scenario", "load-step-short", "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        time.sleep(7)
        mosquitto_private.stop()
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in out and "TypeError" not in out, out
    assert "NOT CONNECTED" in out and "unreachable" in out, out
    (run_dir,) = (tmp_path / "out").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["broker_problem"] and "unreachable" in summary["broker_problem"]
    assert (run_dir / "summary.md").is_file()


def test_without_the_tools_extra_the_demo_says_so_before_starting(tmp_path: Path) -> None:
    """Acceptance round 2 of issue 14 (items 16 and 20's kind): ``rackctl demo`` in an
    install without the tools extra (no amqtt for the embedded broker) ended in a
    ModuleNotFoundError traceback. It says what is missing, at once, and starts nothing."""
    driver = (
        "import sys\n"
        "for m in ('amqtt', 'amqtt.broker'):\n"
        "    sys.modules[m] = None  # an install without the tools extra\n"
        "from rackctl.cli import main\n"
        f"sys.argv = ['rackctl', 'demo', '--duration', '5', '--out', {str(tmp_path / 'out')!r}]\n"
        "sys.exit(main())\n")
    r = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == EXIT_NO_BROKER, out
    assert "tools extra" in out and "--broker" in out, out
    assert "Traceback" not in out, out
    assert not (tmp_path / "out").exists()
