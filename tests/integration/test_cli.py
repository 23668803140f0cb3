"""``rackctl cmd`` and ``rackctl watch`` as a person or a script uses them: real processes
(rackctl and valvey) through a real Mosquitto. Exit codes: 0 ok, 1 refused, 2 usage or
settings, 3 no broker or no reply (rackctl/cli.py). Settings from flags, RACKCTL_*
environment variables or a file."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from typer.testing import CliRunner

from harness.daemons import STARTED, Proc, valvey_proc, write_valvey_config
from harness.servers import InfluxDB1, Mosquitto, free_port
from rackctl.cli import app
from rackplane.commands import AlarmPayload, CommandReply, LeasesState, StatusPayload

pytestmark = [pytest.mark.servers]


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        doc = json.loads(self.out)
        CommandReply.model_validate(doc)
        assert isinstance(doc, dict)
        return doc


def rackctl(*argv: str, env: dict[str, str] | None = None) -> Run:
    """rackctl in this process (typer's runner: the same code, without ~0.7 s of interpreter
    start-up per run); `rackctl_process` runs the real console entry point."""
    result = CliRunner().invoke(app, list(argv), env={"HOME": "/nonexistent", "COLUMNS": "200",
                                                      **(env or {})})
    return Run(result.exit_code, result.stdout, result.stderr)


def rackctl_process(*argv: str) -> Run:
    proc = subprocess.run([sys.executable, "-m", "rackctl", *argv], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "HOME": "/nonexistent"})
    return Run(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """The CLI configures process-wide logging onto the runner's (then closed) streams."""
    saved, root = structlog.get_config(), logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.configure(**saved)
    root.handlers[:], root.level = handlers, level


@pytest.fixture(scope="module")
def valvey(tmp_path_factory: pytest.TempPathFactory, mosquitto: Mosquitto) -> Iterator[Proc]:
    tmp = tmp_path_factory.mktemp("cli")
    rack = f"cli-{uuid.uuid4().hex[:8]}"
    cfg = write_valvey_config(
        tmp / "valvey.toml", identity={"site": "lab", "rack": rack}, mqtt={"port": mosquitto.port},
        cdu={"port": free_port()}, spool={"directory": str(tmp / "spool")},
        commands={"users": {"alice": "operator", "viewer": "reader"}}, log={"format": "json"})
    proc = valvey_proc(tmp, cfg)
    proc.rack = rack  # type: ignore[attr-defined]
    proc.start()
    STARTED.remove(proc)  # shared by this module's tests: stopped here, not after each test
    try:
        yield proc
    finally:
        assert proc.stop() == 0


def flags(mosquitto: Mosquitto, valvey: Proc) -> list[str]:
    return ["--port", str(mosquitto.port), "--rack", valvey.rack]  # type: ignore[attr-defined]


def wait_online(mosquitto: Mosquitto, valvey: Proc) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = rackctl("cmd", "valvey", "get_state", "--json", "--timeout", "1",
                    *flags(mosquitto, valvey))
        if r.code == 0:
            return
        assert valvey.alive(), valvey.log.read_text()[-2000:]
    raise AssertionError("valvey never answered")


def test_cmd_replies_and_exit_codes_for_scripts(
    mosquitto: Mosquitto, valvey: Proc, tmp_path: Path
) -> None:
    wait_online(mosquitto, valvey)
    f = flags(mosquitto, valvey)
    cfg = tmp_path / "rackctl.toml"
    cfg.write_text(f'port = {mosquitto.port}\nrack = "{valvey.rack}"\n'  # type: ignore[attr-defined]
                   'username = "alice"\n')
    # The real console entry point once; the rest in this process.
    ok = rackctl_process("cmd", "valvey", "set_setpoint", "--arg", "setpoint_c=41", "--json",
                         "--username", "alice", "--request-id", "cli-1", *f)
    runs = (
        rackctl("cmd", "valvey", "set_setpoint", "-a", "setpoint_c=99", "--json",
                "--username", "alice", *f),
        rackctl("cmd", "valvey", "set_setpoint", "--args", '{"setpoint_c": 40}', "--json",
                "--username", "viewer", *f),
        rackctl("cmd", "valvey", "nope", "--json", "--username", "alice", *f),
        rackctl("cmd", "valvey", "get_state", "--username", "alice", "--protocol", "3.1.1",
                *f),
        rackctl("cmd", "valvey", "get_state", "--json", env={
            "RACKCTL_PORT": str(mosquitto.port), "RACKCTL_RACK": valvey.rack,  # type: ignore[attr-defined]
            "RACKCTL_USERNAME": "viewer"}),
        rackctl("cmd", "valvey", "get_state", "--json", "--config", str(cfg)),
        rackctl("cmd", "valvey", "get_state", "--json", "--timeout", "1", "--port",
                str(mosquitto.port), "--rack", "nobody-here"),
    )
    out_of_range, forbidden, unknown, human311, from_env, from_file, no_reply = runs
    assert ok.code == 0, ok
    assert ok.json()["ok"] is True and ok.json()["state"]["setpoint_c"] == 41.0
    assert ok.json()["request_id"] == "cli-1"
    assert out_of_range.code == 1 and out_of_range.json()["error"]["code"] == "out_of_range"
    assert forbidden.code == 1 and forbidden.json()["error"]["code"] == "forbidden"
    assert unknown.code == 1 and unknown.json()["error"]["code"] == "unknown_verb"
    assert human311.code == 0 and "valvey get_state: ok" in human311.out
    assert "setpoint_c" in human311.out and "41.0" in human311.out
    assert from_env.code == 0 and from_env.json()["state"]["setpoint_c"] == 41.0
    assert from_file.code == 0, from_file
    assert no_reply.code == 3 and "no valvey of rack 'nobody-here' has ever" in no_reply.err
    # A script retrying with the same request id gets the first reply, applied once.
    retry = rackctl("cmd", "valvey", "set_setpoint", "--arg", "setpoint_c=41", "--json",
                          "--username", "alice", "--request-id", "cli-1", *f)
    assert retry.code == 0 and retry.json() == ok.json()
    refused_human = rackctl("cmd", "valvey", "set_setpoint", "-a", "setpoint_c=99",
                                  "--username", "alice", *f)
    assert refused_human.code == 1 and "refused (out_of_range)" in refused_human.out
    assert "{}" not in refused_human.out, refused_human.out  # no empty state row


def test_watch_shows_status_state_and_alarms(mosquitto: Mosquitto, valvey: Proc) -> None:
    wait_online(mosquitto, valvey)
    f = flags(mosquitto, valvey)
    as_json = rackctl("watch", "valvey", "--json", "--duration", "2.2", *f)
    human = rackctl("watch", "valvey", "--duration", "0.5", *f)
    assert as_json.code == 0, as_json.err
    lines = [json.loads(line) for line in as_json.out.splitlines()]
    kinds = {(x["kind"], x["name"]) for x in lines}
    assert {("status", None), ("state", "supply_loop"), ("state", "health")} <= kinds
    status = [x for x in lines if x["kind"] == "status"]
    assert status[0]["retained"] is True
    assert StatusPayload.model_validate(status[0]["payload"]).status == "online"
    alarms = [x for x in lines if x["kind"] == "alarm" and x["payload"]]
    assert alarms  # no CDU: the fail-safe alarms are up
    for a in alarms:
        AlarmPayload.model_validate(a["payload"])
    assert sum(1 for x in lines if x["name"] == "health") >= 2  # live, not only retained
    for x in lines:  # DESIGN §1: the state shows each output's lease holder
        if (x["kind"], x["name"]) == ("state", "leases"):
            LeasesState.model_validate(x["payload"])
    assert ("state", "leases") in kinds
    # not a terminal (the runner's stdout): one plain line per message, no live view
    assert human.code == 0, human
    plain = human.out.splitlines()
    assert "valvey: online" in plain and "alarms (" not in human.out, human.out
    assert any(x.startswith("state/supply_loop ") and " setpoint_c=" in x for x in plain), plain
    assert any(x.startswith("alarm/") and " severity=" in x for x in plain), plain


def test_watch_into_a_pipe_prints_each_update_as_it_arrives(
        mosquitto: Mosquitto, valvey: Proc) -> None:
    """The real entry point with stdout a pipe (``rackctl watch valvey | grep ...``): the lines
    come while it runs, not only at its end (the live view printed nothing into a pipe)."""
    import selectors

    wait_online(mosquitto, valvey)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rackctl", "watch", "valvey", "--duration", "60",
         *flags(mosquitto, valvey)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "HOME": "/nonexistent"})
    got: list[str] = []
    try:
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(
                x.startswith("state/health ") for x in got) < 2:
            if sel.select(timeout=1.0):
                line = proc.stdout.readline()
                if not line:
                    break
                got.append(line.rstrip("\n"))
        assert proc.poll() is None, (got, proc.stderr.read() if proc.stderr else "")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert "valvey: online" in got, got
    assert sum(x.startswith("state/health ") for x in got) >= 2, got  # live, one per update


@pytest.mark.parametrize("mode", ["--plain", "--json"])
def test_watch_into_a_pipe_the_reader_closes_ends_quietly(
        mosquitto: Mosquitto, valvey: Proc, mode: str) -> None:
    """``rackctl watch valvey | head -3``: once the reader closes the pipe, the watch ends
    within seconds with 141 (128 + SIGPIPE, as ``yes | head``) and no traceback (each message
    raised BrokenPipeError, which the MQTT dispatcher logged, and the watch ran on forever)."""
    wait_online(mosquitto, valvey)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rackctl", "watch", "valvey", mode, "--duration", "120",
         *flags(mosquitto, valvey)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "HOME": "/nonexistent"})
    try:
        assert proc.stdout is not None and proc.stderr is not None
        got = [proc.stdout.readline() for _ in range(3)]
        assert all(got), got
        proc.stdout.close()  # what head does after its lines
        closed_at = time.monotonic()
        code = proc.wait(timeout=60)  # the next message (health: every few s) finds it closed
        took_s = time.monotonic() - closed_at
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert code == 141, (code, err)
    assert took_s < 15, took_s  # ended at the first message after the close, not at --duration
    assert "Traceback" not in err and "BrokenPipe" not in err and "mqtt_handler" not in err, err


def test_cmd_shows_a_refusal_without_request_id(mosquitto: Mosquitto, valvey: Proc) -> None:
    """An envelope the daemon cannot read (over 16 kB) is refused with request_id null; v5
    Correlation Data still brings the refusal to rackctl: exit 1 at once, not "no reply"
    (rackctl's own limit raised: by default it refuses such an envelope itself, below)."""
    wait_online(mosquitto, valvey)
    f = flags(mosquitto, valvey)
    big = json.dumps({"note": "x" * 17_000})
    t0 = time.monotonic()
    raised = {"RACKCTL_MAX_PAYLOAD_BYTES": "65536"}
    r = rackctl("cmd", "valvey", "get_state", "--args", big, "--json", "--username", "alice",
                "--timeout", "30", *f, env=raised)
    assert r.code == 1, r
    assert r.json()["error"]["code"] == "too_large" and r.json()["request_id"] is None
    assert time.monotonic() - t0 < 25  # the reply, not the timeout
    human = rackctl("cmd", "valvey", "get_state", "--args", big, "--username", "alice", *f,
                    env=raised)
    assert human.code == 1 and "refused (too_large)" in human.out, human


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_cmd_refuses_an_envelope_over_the_daemons_limit_itself(
        mosquitto: Mosquitto, valvey: Proc, protocol: str) -> None:
    """``--arg reason=<100 kB>``: refused here at once, exit 2, the size and the limit named
    (it was sent, refused unread by the daemon, and over 3.1.1 read as "no reply ... the
    daemon may be down" after the whole timeout). Just under the limit it is still sent."""
    from rackplane.settings import CommandSettings

    limit = CommandSettings().max_payload_bytes
    wait_online(mosquitto, valvey)
    f = [*flags(mosquitto, valvey), "--protocol", protocol, "--username", "alice"]
    t0 = time.monotonic()
    r = rackctl("cmd", "valvey", "get_state", "--arg", "note=" + "x" * 100_000,
                "--timeout", "20", *f)
    assert r.code == 2, r
    assert time.monotonic() - t0 < 5, r  # refused locally, not after the reply timeout
    assert "too large" in r.err and f"{limit} bytes" in r.err and "not sent" in r.err, r
    assert r.err.count("\n") <= 2, r
    ok = rackctl("cmd", "valvey", "get_state", "--arg", "note=" + "x" * (limit - 1024),
                 "--json", "--timeout", "20", *f)
    assert ok.code in (0, 1) and ok.json()["request_id"] is not None, ok  # sent, answered


def test_replay_to_a_dead_url_reports_retries_and_gives_up(tmp_path: Path) -> None:
    from rackplane.io.spool import Spool

    with Spool(tmp_path / "spool") as sp:
        sp.append(["m v=1 1000000000"])
    r = rackctl("replay", str(tmp_path / "spool"), "--url", "http://127.0.0.1:1",
                "--give-up", "1")
    assert r.code == 1, r
    assert "retry 1" in r.out and "replay stopped early: gave up after 1" in r.err, r


@pytest.mark.parametrize("what", ["missing", "empty", "other files", "a file"])
def test_replay_refuses_what_is_not_a_spool_and_creates_nothing(tmp_path: Path,
                                                                   what: str) -> None:
    """A typo'd path or a folder that is not a spool: exit 2 with the reason on one line, and
    nothing created (it "replayed" as complete, exit 0, leaving a replay-cursor there)."""
    target = tmp_path / "spool"
    if what == "empty":
        target.mkdir()
    elif what == "other files":
        target.mkdir()
        (target / "notes.txt").write_text("x\n")
    elif what == "a file":
        target.write_text("x\n")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    r = rackctl("replay", str(target), "--url", "http://127.0.0.1:1", "--give-up", "1")
    assert r.code == 2, r
    assert r.err.count("\n") == 1 and str(target) in r.err, r
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_replay_into_influxdb1_with_api_v1(tmp_path: Path, influxdb1: InfluxDB1) -> None:
    from rackplane.io.spool import Spool

    with Spool(tmp_path / "spool") as sp:
        sp.append([f"m v={i} {1_767_225_600 * 10**9 + i}" for i in range(3)])
    db = f"cli{uuid.uuid4().hex[:8]}"
    influxdb1.create_database(db)
    r = rackctl("replay", str(tmp_path / "spool"), "--url", influxdb1.url, "--api", "v1",
                "--database", db)
    assert r.code == 0, r
    res = influxdb1.query('SELECT "v" FROM "m"', db)["results"][0]
    assert [v[1] for v in res["series"][0]["values"]] == [0, 1, 2]
    bad = rackctl("replay", str(tmp_path / "spool"), "--url", influxdb1.url, "--api", "v3")
    assert bad.code != 0 and "api" in bad.err, bad


# --- what a new user meets first: no broker there, a rack nobody runs, -h ----------------------


@pytest.mark.parametrize("protocol", ["auto", "3.1.1"])
def test_nothing_listening_on_the_port_fails_at_once_naming_it(protocol: str) -> None:
    """A port nothing listens on refuses the connection: exit 3 at once with host:port and the
    OS error, not "no connection within 20 s" after the whole connect timeout (v5 or the
    3.1.1 fallback cannot fix it)."""
    port = free_port()  # nobody listens on it
    f = ["--port", str(port), "--connect-timeout", "20", "--protocol", protocol]
    for argv in (["cmd", "valvey", "get_state", "--timeout", "20"],
                 ["watch", "valvey", "--duration", "30"]):
        t0 = time.monotonic()
        r = rackctl(*argv, *f)
        took_s = time.monotonic() - t0
        assert r.code == 3, r
        assert f"connection refused: is a broker listening on 127.0.0.1:{port}?" in r.err, r
        assert "Connection refused" in r.err, r  # the OS error, as written
        assert took_s < 10, (took_s, r)  # refused: at once, well before the 20 s timeout


def test_an_unknown_broker_host_fails_at_once_naming_it() -> None:
    t0 = time.monotonic()
    r = rackctl("cmd", "valvey", "get_state", "--host", "no-such-broker.invalid",
                "--connect-timeout", "20")
    assert r.code == 3, r
    assert "cannot resolve the broker host 'no-such-broker.invalid'" in r.err, r
    assert time.monotonic() - t0 < 10, r


def test_a_port_that_accepts_but_never_answers_is_waited_for() -> None:
    """Waiting can help there (a slow broker): the connect timeout still applies, and its
    message says so."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel accepts; nobody ever sends a CONNACK
        port = silent.getsockname()[1]
        r = rackctl("cmd", "valvey", "get_state", "--port", str(port), "--connect-timeout", "1")
    assert r.code == 3, r
    assert f"no connection to the broker at 127.0.0.1:{port} within" in r.err, r
    assert "connection refused" not in r.err, r


def test_a_rack_nobody_runs_is_said_plainly(mosquitto: Mosquitto, valvey: Proc) -> None:
    """``--rack`` naming a rack where no valvey ever connected: the command reaches no one,
    said after about a second (not "no reply ... the daemon may be down ... TTL" after the
    whole timeout), with the racks whose valvey did connect; ``watch`` says it and goes on."""
    wait_online(mosquitto, valvey)
    rack = f"nosuch-{uuid.uuid4().hex[:6]}"
    f = ["--port", str(mosquitto.port), "--rack", rack]
    t0 = time.monotonic()
    r = rackctl("cmd", "valvey", "get_state", "--timeout", "20", *f)
    took_s = time.monotonic() - t0
    assert r.code == 3, r
    assert (f"no valvey of rack '{rack}' has ever connected to this broker (no retained "
            f"rackplane/lab/{rack}/valvey/status)") in r.err, r
    assert "racks seen: " in r.err and valvey.rack in r.err, r  # type: ignore[attr-defined]
    assert "TTL" not in r.err, r
    assert took_s < 10, (took_s, r)  # well before the 20 s reply timeout
    w = rackctl("watch", "valvey", "--json", "--duration", "2", *f)
    assert w.code == 0 and w.out == "", w
    assert f"no valvey of rack '{rack}' has ever connected" in w.err, w
    assert "watching anyway" in w.err, w
    here = rackctl("watch", "valvey", "--json", "--duration", "1.5", *flags(mosquitto, valvey))
    assert here.code == 0 and "ever connected" not in here.err, here


def test_a_daemon_that_went_offline_is_said_with_its_time(mosquitto: Mosquitto) -> None:
    """A rack whose valvey stopped: its retained status says offline; the reply timeout says
    since when (the command may still be applied if it comes back)."""
    from rackplane.clock import SYSTEM_CLOCK
    from rackplane.io.mqtt import MqttLink
    from rackplane.settings import Identity, MqttSettings

    rack = f"gone-{uuid.uuid4().hex[:6]}"

    async def run_and_stop() -> None:
        link = MqttLink(MqttSettings(port=mosquitto.port), Identity(site="lab", rack=rack),
                        "valvey", clock=SYSTEM_CLOCK)
        task = asyncio.create_task(link.run())
        await link.wait_ready(10)
        await link.stop(5)
        await task

    asyncio.run(run_and_stop())
    r = rackctl("cmd", "valvey", "get_state", "--timeout", "1", "--port", str(mosquitto.port),
                "--rack", rack)
    assert r.code == 3, r
    assert f"no reply from valvey to get_state within 1 s: valvey of rack '{rack}' is offline " \
           "since 20" in r.err, r
    assert "--request-id rc-" in r.err, r


@pytest.mark.parametrize("argv", [["-h"], ["cmd", "-h"], ["watch", "-h"]])
def test_dash_h_is_help(argv: list[str]) -> None:
    r = rackctl(*argv)
    assert r.code == 0, r
    assert "Usage:" in r.out and "--help" in r.out and "-h" in r.out, r
