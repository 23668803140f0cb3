"""rackctl's command client without a broker: where its settings come from (flags >
RACKCTL_* environment > file > defaults; secrets only from the environment), how ``--arg`` /
``--args`` become the args object, and the exit codes a script sees for usage and settings
errors (2) and for no broker (3). The broker paths: tests/integration/test_cli.py."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from typer.testing import CliRunner

from harness.servers import free_port
from rackctl.cli import app
from rackctl.client import (
    ClientSettings,
    CommandClient,
    load_client_settings,
    parse_args,
    validate_request_id,
    watch_filters,
)
from rackplane.errors import ConfigError
from rackplane.io.mqtt import Message


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """The CLI configures process-wide logging onto the runner's (then closed) streams."""
    saved, root = structlog.get_config(), logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.configure(**saved)
    root.handlers[:], root.level = handlers, level


def closed_port() -> int:
    return free_port()  # free now, nothing listening: connections are refused


def test_settings_precedence_flags_env_file_defaults(tmp_path: Path) -> None:
    cfg = tmp_path / "rackctl.toml"
    cfg.write_text('host = "broker.lab"\nport = 8883\nsite = "s1"\nrack = "r7"\n'
                   'ca_file = "certs/ca.crt"\nusername = "alice"\n')
    env = {"RACKCTL_PORT": "9883", "RACKCTL_RACK": "r8", "HOME": str(tmp_path)}
    s = load_client_settings({"rack": "r9", "host": None}, config=cfg, environ=env)
    assert (s.host, s.port, s.site, s.rack) == ("broker.lab", 9883, "s1", "r9")
    assert s.ca_file == tmp_path / "certs" / "ca.crt"  # relative to the file
    assert s.topic_user == "alice"
    m = s.mqtt({"RACKCTL_PASSWORD": "x"})
    assert m.tls is not None and m.clean_session and m.password_env == "RACKCTL_PASSWORD"
    assert m.client_id and m.client_id.startswith("rackctl-alice-")
    assert s.mqtt({}).password_env is None  # no password variable: no password
    assert s.mqtt({}).client_id != m.client_id  # two runs never share a client id
    # The file named by RACKCTL_CONFIG, else ~/.config/rackctl/config.toml if present.
    assert load_client_settings(environ={**env, "RACKCTL_CONFIG": str(cfg)}).site == "s1"
    (tmp_path / ".config" / "rackctl").mkdir(parents=True)
    (tmp_path / ".config" / "rackctl" / "config.toml").write_text('site = "home"\n')
    assert load_client_settings(environ={"HOME": str(tmp_path)}).site == "home"
    assert load_client_settings(environ={"HOME": str(tmp_path / "none")}) == ClientSettings()


@pytest.mark.parametrize(("text", "env", "flags", "match"), [
    ('password = "x"\n', {}, {}, "secrets never go in files"),
    ('port = "many"\n', {}, {}, "port"),
    ("", {"RACKCTL_PROTOCOL": "4"}, {}, "protocol"),
    ("", {}, {"user": "a/b"}, "user"),
    ("", {}, {"cert_file": "c.pem"}, "cert_file and key_file go together"),
    ('unknown_key = 1\n', {}, {}, "unknown_key"),
])
def test_bad_settings_name_the_key(tmp_path: Path, text: str, env: dict[str, str],
                                   flags: dict[str, Any], match: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_client_settings(flags, config=cfg, environ=env)


def test_parse_args_json_values_and_plain_strings() -> None:
    assert parse_args(["setpoint_c=40", "mode=manual", "output_pct=12.5", "force=true",
                       "ids=[1,2]", "name=\"40\"", "empty="], '{"a": 1, "mode": "auto"}') == {
        "a": 1, "mode": "manual", "setpoint_c": 40, "output_pct": 12.5, "force": True,
        "ids": [1, 2], "name": "40", "empty": ""}
    for pairs, args_json in ((["novalue"], None), (["=1"], None), ([], "[1]"), ([], "{bad")):
        with pytest.raises(ValueError):
            parse_args(pairs, args_json)


def test_watch_filters() -> None:
    topics = ClientSettings(site="lab", rack="r1").topics("valvey")
    assert watch_filters(topics) == ["rackplane/lab/r1/valvey/status",
                                     "rackplane/lab/r1/valvey/status/+",
                                     "rackplane/lab/r1/valvey/state/+",
                                     "rackplane/lab/r1/valvey/alarm/+"]


@pytest.mark.parametrize(("argv", "code", "text"), [
    (["cmd", "valvey", "get_state", "--arg", "novalue"], 2, "expected key=value"),
    (["cmd", "valvey", "get_state", "--args", "[1]"], 2, "JSON object"),
    (["cmd", "valvey", "bad/verb"], 2, "invalid daemon or verb"),
    (["cmd", "va+lvey", "get_state"], 2, "invalid daemon or verb"),
    (["cmd", "valvey", "get_state", "--port", "0"], 2, "port"),
    (["cmd", "valvey", "get_state", "--config", "/nonexistent/rackctl.toml"], 2, "not found"),
    (["cmd", "valvey"], 2, "Missing argument"),
    (["watch", "valvey", "--protocol", "6"], 2, "protocol"),
    # F3: non-finite numbers, a bad request id, a missing CA file, a negative duration
    (["cmd", "valvey", "set_setpoint", "--arg", "setpoint_c=NaN"], 2, "finite numbers only"),
    (["cmd", "valvey", "set_setpoint", "--args", '{"setpoint_c": 1e400}'], 2, "out of range"),
    (["cmd", "valvey", "get_state", "--request-id", "bad id with spaces"], 2, "no spaces"),
    (["cmd", "valvey", "get_state", "--ca-file", "/nope.pem"], 2, "/nope.pem: no such file"),
    (["watch", "valvey", "--ca-file", "/nope.pem"], 2, "/nope.pem: no such file"),
    (["watch", "valvey", "--duration", "-5"], 2, "--duration"),
    (["replay", "/tmp", "--url", "notaurl"], 2, "invalid option: url: "),
    (["demo", "--broker", "localhost:notaport"], 2, "expected HOST:PORT"),
])
def test_usage_and_settings_errors_exit_2(argv: list[str], code: int, text: str) -> None:
    result = CliRunner().invoke(app, argv, env={"HOME": "/nonexistent"})
    assert result.exit_code == code, result.output
    assert text in result.output


def test_usage_errors_are_one_clean_line() -> None:
    """No traceback, no pydantic link: a script or a person reads one line."""
    for argv in (["cmd", "valvey", "set_setpoint", "--arg", "setpoint_c=NaN"],
                 ["replay", "/tmp", "--url", "notaurl"]):
        result = CliRunner().invoke(app, argv, env={"HOME": "/nonexistent", "COLUMNS": "300"})
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output and "errors.pydantic.dev" not in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output


def test_parse_args_refuses_non_finite_numbers() -> None:
    for pairs, js in ((["x=NaN"], None), (["x=-Infinity"], None), (["x=1e400"], None),
                      ([], '{"x": NaN}'), ([], '{"x": [1, 1e999]}')):
        with pytest.raises(ValueError, match="finite numbers only"):
            parse_args(pairs, js)
    assert parse_args(["x=1e300", "m=NaNny"]) == {"x": 1e300, "m": "NaNny"}


def test_request_id_checked_by_the_daemons_rule() -> None:
    assert validate_request_id("op-42:a.b_c") == "op-42:a.b_c"
    for bad in ("", "bad id", "x" * 65, "é"):
        with pytest.raises(ValueError, match="request-id"):
            validate_request_id(bad)


async def test_reply_with_null_request_id_matched_by_correlation_data() -> None:
    """A daemon's too_large / invalid_envelope refusal has request_id null (the envelope was
    unreadable) but echoes the v5 Correlation Data: the waiting call gets it."""
    client = CommandClient(ClientSettings(port=closed_port()))
    fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    client._pending["rc-1"] = fut
    client._by_correlation[b"c-1"] = "rc-1"
    body = {"request_id": None, "ok": False, "state": None,
            "error": {"code": "too_large", "message": "over 16384 bytes"}}
    client._on_reply(Message("t/result/n", json.dumps(body).encode(), correlation_data=b"other"))
    assert not fut.done()
    client._on_reply(Message("t/result/n", json.dumps(body).encode(), correlation_data=b"c-1"))
    assert fut.done() and fut.result()["error"]["code"] == "too_large"
    assert client.arrivals == ["rc-1"]


def _reply(rid: str | None, *, corr: bytes | None = None, retain: bool = False) -> Message:
    body = {"request_id": rid, "ok": True, "error": None, "state": {}}
    return Message("t/result/n", json.dumps(body).encode(), retain=retain,
                   correlation_data=corr)


async def test_v5_matches_by_correlation_data_never_by_a_foreign_request_id() -> None:
    """Issue 14 item 12: on v5 the Correlation Data decides; a reply carrying our request_id
    but another request's correlation data, or a retained one, is not our reply."""
    client = CommandClient(ClientSettings(port=closed_port(), protocol="5"))
    loop = asyncio.get_running_loop()
    fut_a: asyncio.Future[dict[str, Any]] = loop.create_future()
    fut_b: asyncio.Future[dict[str, Any]] = loop.create_future()
    client._pending.update({"a": fut_a, "b": fut_b})
    client._by_correlation.update({b"ca": "a", b"cb": "b"})
    client._on_reply(_reply("a", corr=b"cb"))  # b's correlation, a's id: refused
    client._on_reply(_reply("a", corr=b"zz"))  # unknown correlation
    client._on_reply(_reply("a", corr=b"ca", retain=True))  # retained
    assert not fut_a.done() and not fut_b.done()
    assert client.ignored_replies == {"unmatched": 2, "retained": 1}
    client._on_reply(_reply("a", corr=b"ca"))
    assert fut_a.done() and not fut_b.done()


async def test_3_1_1_matches_by_request_id_and_ignores_retained() -> None:
    client = CommandClient(ClientSettings(port=closed_port(), protocol="3.1.1"))
    fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    client._pending["a"] = fut
    client._on_reply(_reply("a", retain=True))  # e.g. a stale retained reply at subscribe
    client._on_reply(_reply(None))
    client._on_reply(_reply("other"))
    assert not fut.done()
    assert client.ignored_replies == {"retained": 1, "unmatched": 2}
    client._on_reply(_reply("a"))
    assert fut.done() and client.arrivals == ["a"]


@pytest.mark.parametrize("command", ["cmd", "watch"])
def test_no_broker_exits_3_quickly(command: str) -> None:
    argv = [command, "valvey"] + (["get_state"] if command == "cmd" else []) + [
        "--port", str(closed_port()), "--connect-timeout", "0.5"]
    result = CliRunner().invoke(app, argv, env={"HOME": "/nonexistent"})
    assert result.exit_code == 3, result.output
    assert "connection refused: is a broker listening on" in result.output  # at once


# --- the thin issue-8 commands: rackctl bench / rackctl scenarios ------------------------------


def test_bench_and_scenarios_call_their_modules_lazily(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys
    import types

    calls: list[tuple[str, dict[str, Any]]] = []
    bench = types.ModuleType("harness.bench")
    report = types.ModuleType("harness.report")

    def bench_main(**kw: Any) -> int:
        calls.append(("bench", kw))
        return 1

    def report_main(**kw: Any) -> int:
        calls.append(("report", kw))
        return 0

    bench.main = bench_main  # type: ignore[attr-defined]
    report.main = report_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "harness.bench", bench)
    monkeypatch.setitem(sys.modules, "harness.report", report)
    r = CliRunner().invoke(app, ["bench", "--out", str(tmp_path), "--quick"])
    assert r.exit_code == 1  # the module's verdict is the exit code
    r = CliRunner().invoke(app, ["bench", "--out", str(tmp_path), "--only", "chaos",
                                 "--chaos-failovers", "5"])
    assert r.exit_code == 1
    r = CliRunner().invoke(app, ["bench", "--out", str(tmp_path), "--chaos-failovers", "0"])
    assert r.exit_code == 2  # below its bound: a usage error, the module not called
    r = CliRunner().invoke(app, ["scenarios", "--out", str(tmp_path / "s"), "--only", "S1",
                                 "--only", "S4"])
    assert r.exit_code == 0
    r = CliRunner().invoke(app, ["scenarios", "--out", str(tmp_path)])
    assert r.exit_code == 0
    assert calls == [
        ("bench", {"out": tmp_path, "quick": True, "only": None, "chaos_failovers": 20}),
        ("bench", {"out": tmp_path, "quick": False, "only": ["chaos"], "chaos_failovers": 5}),
        ("report", {"out": tmp_path / "s", "quick": False, "only": ["S1", "S4"]}),
        ("report", {"out": tmp_path, "quick": False, "only": None}),
    ]


def test_bench_and_scenarios_missing_module_is_a_clear_error_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "harness.bench", None)  # import raises ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "harness.report", None)
    for argv in (["bench", "--out", str(tmp_path)], ["scenarios", "--out", str(tmp_path)]):
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 2
        assert "not installed" in r.stderr


# --- rackctl lockstep runs either daemon's scenarios (the harness imported lazily) ------------


def test_lockstep_racky_hands_its_subcommand_to_the_harness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys
    import types

    calls: list[list[str]] = []
    racky = types.ModuleType("harness.lockstep_racky")

    def racky_main(argv: list[str]) -> int:
        calls.append(list(argv))
        return 1 if argv[0] == "validate" else 0

    racky.main = racky_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "harness.lockstep_racky", racky)
    out = str(tmp_path / "report")
    r = CliRunner().invoke(app, ["lockstep", "--daemon", "racky", "validate", "--stage", "rack",
                                 "--out", out])
    assert r.exit_code == 1  # the validation's verdict is the exit code
    r = CliRunner().invoke(app, ["lockstep", "-d", "racky", "run", "flapping-link",
                                 "--duration", "60", "--plant-dt", "1"])
    assert r.exit_code == 0
    assert calls == [["validate", "--stage", "rack", "--out", out],
                     ["run", "flapping-link", "--duration", "60", "--plant-dt", "1"]]


def test_lockstep_refuses_an_unknown_daemon_and_misplaced_options() -> None:
    r = CliRunner().invoke(app, ["lockstep", "--daemon", "fleet"])
    assert r.exit_code == 2 and "expected valvey or racky" in r.stderr
    r = CliRunner().invoke(app, ["lockstep", "load-step", "--seeds", "3"])
    assert r.exit_code == 2 and "unexpected arguments for valvey" in r.stderr
    r = CliRunner().invoke(app, ["lockstep", "-d", "racky", "run", "x", "--config", "v.toml"])
    assert r.exit_code == 2 and "--config is valvey's" in r.stderr


def test_lockstep_racky_runs_the_real_harness() -> None:
    """A short real run: racky's core in lock-step with the virtual rack, through rackctl."""
    r = CliRunner().invoke(app, ["lockstep", "--daemon", "racky", "run", "flapping-link",
                                 "--duration", "10", "--plant-dt", "1"])
    assert r.exit_code == 0, r.output
    assert "scenario flapping-link: 11 ticks" in r.stdout
