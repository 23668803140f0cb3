"""A running demo you can talk to (issue 20 item 2): ``rackctl demo`` (real processes: the
embedded amqtt broker, the rack simulator, racky, valvey) prints how to reach it, and every
``rackctl`` example of README.md's command block works against it as written, each getting
its reply; the broker's tracebacks (rackctl's MQTT v5 attempt) stay in the run's broker.log.
At the end the summary shows racky in the run: its lifecycle, its rack power (valvey's
feedforward source) against the budget. It runs the default demo (a row: r12, r13; under rlc
where nats-server is installed, as in CI), the one a new user starts."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.servers import Mosquitto, free_port
from rackctl.cli import EXIT_OK, EXIT_REFUSED

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"
DEMO_S = 75.0
"""The demo's duration here, s: long enough for the commands below and racky's figures (no
step is scored: the commands move the setpoint and put the valve in manual)."""


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def readme_command_examples() -> list[str]:
    """The ``rackctl`` lines of README's command block (the first ``sh`` block of its
    "### MQTT" section), comments stripped."""
    text = README.read_text()
    block = text.split("\n### MQTT\n", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    out = []
    for line in block.splitlines():
        line = line.split("  #", 1)[0].strip()
        if line.startswith("rackctl "):
            out.append(line)
    return out


def rackctl(argv: list[str], env: dict[str, str], timeout_s: float = 60
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rackctl", *argv], capture_output=True,
                          text=True, env=env, timeout=timeout_s)


def test_the_readme_examples_work_against_the_running_demo(tmp_path: Path) -> None:
    examples = readme_command_examples()
    verbs = {" ".join(shlex.split(e)[1:4]) for e in examples}
    assert {"cmd valvey get_state", "cmd valvey set_setpoint", "cmd racky set_budget",
            "watch racky"} <= verbs, examples
    demo = subprocess.Popen(
        [sys.executable, "-m", "rackctl", "demo", "--duration", f"{DEMO_S:g}",
         "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    assert demo.stdout is not None
    head: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = demo.stdout.readline()
            if not line:
                break
            head.append(line)
            if "without the file:" in line:
                break
        text = "".join(head)
        m = re.search(r"export RACKCTL_CONFIG=(\S+)", text)
        assert m, text
        assert re.search(r"broker: 127\.0\.0\.1:\d+ .*user 'operator' has the operator role",
                         text), text
        env = dict(os.environ, RACKCTL_CONFIG=m.group(1))
        results: dict[str, subprocess.CompletedProcess[str]] = {}
        for example in examples:
            argv = shlex.split(example)[1:]
            if argv[0] == "watch":  # runs until Ctrl-C: give it a few seconds, then SIGINT
                # Ctrl-C as a user's terminal delivers it: a pytest-xdist worker ignores SIGINT
                # and a child inherits the ignore (Python then installs no KeyboardInterrupt
                # handler), so the watch is started with SIGINT back at its default
                w = subprocess.Popen([sys.executable, "-m", "rackctl", *argv],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, preexec_fn=_sigint_default)
                time.sleep(8)
                w.send_signal(signal.SIGINT)
                try:
                    out, _ = w.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    w.kill()  # no orphan left behind; the test fails below
                    w.communicate()
                    raise
                results[example] = subprocess.CompletedProcess(argv, w.returncode or 0, out, "")
                continue
            # racky's first state may still be on its way: a command waits for its reply
            results[example] = rackctl(argv, env)
        # the printed line without the file: flags only, protocol negotiated (v5, then 3.1.1)
        # (printed as the venv's own path to rackctl when its bin is not on PATH)
        bare = re.search(r"without the file: \S*rackctl (.+?)\)\s*$", text, re.M)
        assert bare, text
        plain_env = {k: v for k, v in os.environ.items() if not k.startswith("RACKCTL_")}
        neg = rackctl(shlex.split(bare.group(1)), plain_env)
        rest, _ = demo.communicate(timeout=DEMO_S + 120)
    finally:
        if demo.poll() is None:
            demo.kill()
    console = text + rest
    for example, r in results.items():
        out = r.stdout + r.stderr
        assert "Traceback" not in out, (example, out)
        if example.startswith("rackctl watch"):
            assert r.returncode == EXIT_OK, (example, out)
            assert "rack_power" in out and "lifecycle" in out, (example, out)
        elif example.startswith("rackctl handover"):
            # a single valvey has no standby: refused, with the daemon's reply saying so
            assert r.returncode == EXIT_REFUSED and "single instance" in out, (example, out)
        elif example.startswith("rackctl pair"):
            assert r.returncode == EXIT_OK and "single instance, online" in out, (example, out)
        else:
            assert r.returncode == EXIT_OK, (example, out)
        if "--json" in example:
            reply = json.loads(r.stdout)
            assert reply["ok"] is True and reply["request_id"], (example, out)
    sp = next(r for e, r in results.items() if "set_setpoint" in e)
    assert "44" in sp.stdout
    assert neg.returncode == EXIT_OK and "setpoint_c" in neg.stdout, neg.stdout + neg.stderr
    # the embedded broker's complaints about the v5 attempt went to its log, not the console
    assert demo.returncode == 0, console[-3000:]
    assert "Traceback" not in console and "client_connected_cb" not in console, console
    (run_dir,) = (tmp_path / "out").iterdir()
    assert "Traceback" in (run_dir / "broker.log").read_text()
    row = json.loads((run_dir / "summary.json").read_text())
    # the default demo is a row (issue 20): the README's examples name r12, its first rack
    assert [r["rack"] for r in row["racks"]] == ["r12", "r13"], row["racks"]
    summary = row["racks"][0]
    racky = summary["racky"]
    # the demo's rack starts in production; its link flap (t = 90 s) comes after this run's
    # end
    assert racky["lifecycle"] == "production" and racky["exit_code"] == 0, racky
    assert racky["shelves_reporting"] == "8/8" and racky["rack_power_samples"] > 20, racky
    assert racky["budget_w"] == 120_000.0  # the README's set_budget applied
    assert summary["ff_source_share"].get("rack_power", 0) > 0.5, summary["ff_source_share"]
    assert summary["valvey_exit_code"] == 0
    assert "racky: lifecycle production" in (run_dir / "summary.md").read_text()
    # the commands sent are named in the summary (the figures include the accepted ones' effects)
    cmds = summary["commands"]
    assert any("→ valvey set_setpoint" in c for c in cmds), cmds
    assert any("→ racky set_budget" in c for c in cmds), cmds
    assert not any(c.endswith("/result") for c in cmds), cmds
    # ... and their replies: the README's examples are accepted, each named once
    acc = summary["commands_accepted"]
    assert any("→ valvey set_setpoint" in c for c in acc), summary
    assert any("→ racky set_budget" in c for c in acc), summary
    assert len(acc) + len(summary["commands_refused"]) + len(
        summary["commands_unanswered"]) == len(cmds)
    assert "operator commands during the run" in (run_dir / "summary.md").read_text()
    assert "operator commands during the run" in console


@pytest.mark.servers
async def test_auto_protocol_gets_v5_from_mosquitto_and_3_1_1_from_amqtt(
        tmp_path: Path, mosquitto: Mosquitto) -> None:
    """``protocol = auto`` (the default): MQTT v5 where the broker speaks it, else 3.1.1
    (amqtt never answers a v5 CONNECT); an explicit version is kept as given."""
    from harness.demo.procs import route_broker_logging, start_amqtt
    from rackctl.client import ClientSettings, CommandClient

    async with CommandClient(ClientSettings(port=mosquitto.port, connect_timeout_s=4)) as c:
        assert c.protocol == "5" and c.requested_protocol == "auto"
    port = free_port()
    handler = route_broker_logging(tmp_path / "broker.log")
    broker = await start_amqtt(port)
    try:
        async with CommandClient(ClientSettings(port=port, connect_timeout_s=4)) as c:
            assert c.protocol == "3.1.1" and c.link.connected
        # the dropped v5 attempt's tasks (aiomqtt's misc loop polls each second; amqtt's
        # connection handler sees the socket closed) end within a poll: let them
        await asyncio.sleep(1.5)
        async with CommandClient(ClientSettings(port=port, protocol="3.1.1")) as c:
            assert c.protocol == "3.1.1" and c.requested_protocol == "3.1.1"
    finally:
        await broker.shutdown()
        handler.close()
