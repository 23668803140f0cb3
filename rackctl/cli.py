"""rackctl: the operator's CLI: commands to the daemons, a live view of their state and
alarms, the demo, replay of the embedded store, lock-step runs, the contract's schemas.

Exit codes of cmd and watch (for scripts): 0 ok; 1 the daemon refused the command (an
error reply) or the broker's ACL refused it; 2 usage or settings (bad flag, bad file, login
refused by the broker); 3 no broker or no reply in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.live import Live
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from rackctl.options import NO_OPTIONS, Connection, connection_options
from rackctl.stdout import run_closing_quietly, stdout_closed, write_lines
from rackctl.watch_view import WatchView as _WatchView
from rackctl.watch_view import reply_table
from rackplane.cli import EXIT_CONFIG, EXIT_RUNTIME, fail_config, typer_app
from rackplane.errors import ConfigError, MqttError, SpoolError
from rackplane.log import configure_logging
from rackplane.settings import TsdbSettings

__all__ = [
    "EXIT_NO_BROKER",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "bench",
    "cmd",
    "daemon_contracts",
    "demo",
    "lockstep",
    "main",
    "replay",
    "scenarios",
    "schemas",
    "shipped_schema_sets",
    "watch",
]

app: typer.Typer = typer_app(help=__doc__, no_args_is_help=True,
                             context_settings={"help_option_names": ["-h", "--help"]})

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = EXIT_CONFIG  # 2
EXIT_NO_BROKER = 3


@app.command(short_help="Run the demo on the rack simulator.")
def demo(
    duration: Annotated[
        float | None,
        typer.Option("--duration", min=5, help="seconds to run (default: the scenario's length)"),
    ] = None,
    scenario: Annotated[str, typer.Option(
        help="bundled scenario name or TOML path")] = "demo-load-step",
    broker: Annotated[
        str | None,
        typer.Option(help="HOST:PORT of a Mosquitto to use instead of the embedded broker"),
    ] = None,
    out: Annotated[Path, typer.Option(help="folder for the run's outputs")] = Path("demo-output"),
    racks: Annotated[int, typer.Option(
        min=1, max=4, help="racks side by side (a row: r12, r13, ...), each its own "
        "simulator (its trays through the tray agent), valvey and racky; 1: one rack alone")
    ] = 2,
    nats_server: Annotated[str | None, typer.Option(
        "--nats-server", help="a row (--racks 2..4) runs under rlc on this nats-server binary "
        "(default: $RACKPLANE_DEMO_NATS_SERVER, else nats-server on PATH or in /usr/sbin); "
        "'none': the row without rlc")] = None,
) -> None:
    """Run a row of racks (default 2), each its simulator, valvey and racky, on embedded
    defaults, live, then summarise (and print how to reach the running demo with rackctl).
    A row runs under rlc (budgets as leases, a validation campaign) when nats-server is
    installed; --racks 1 runs one rack alone."""
    started_mono = time.monotonic()  # the summary's wall time counts from here
    from harness.demo import (
        BrokerUnreachable,
        RowSummary,
        embedded_broker_problem,
        print_row_summary,
        print_summary,
        run_demo,
    )

    if nats_server is not None and nats_server.strip().lower() not in ("none", "off", ""):
        # a binary the user named and that is not there is a usage error, not a quiet
        # fallback to the row without rlc (that is what --nats-server none asks for)
        from harness.demo.fleet import find_nats_server

        found, why = find_nats_server(nats_server)
        if found is None:
            _fail(f"--nats-server {nats_server!r}: {why}; name the nats-server binary, or "
                  "'none' for the row without rlc", EXIT_USAGE)
    if broker is not None:
        _host, _, port_s = broker.partition(":")
        if port_s and not (port_s.isdigit() and 1 <= int(port_s) <= 65535):
            _fail(f"--broker {broker!r}: expected HOST:PORT with a port 1..65535", EXIT_USAGE)
    if not broker:
        # the embedded broker is the tools extra's: said before anything starts (an install
        # without it ended in a ModuleNotFoundError traceback)
        problem = embedded_broker_problem()
        if problem is not None:
            _fail("demo not started: the embedded MQTT broker needs the tools extra (pip "
                  f"install 'rackplane[tools]'; {problem}), or pass --broker HOST:PORT of a "
                  "running Mosquitto", EXIT_NO_BROKER)
    configure_logging("warning", "console")
    console = Console()
    try:
        summary = asyncio.run(
            run_demo(
                scenario=scenario, duration_s=duration, broker=broker, out_root=out,
                console=console, racks=racks, nats_server=nats_server,
                started_mono=started_mono,
            )
        )
    except ConfigError as err:
        fail_config(err)
        return
    except BrokerUnreachable as err:
        _fail(f"demo not started: {err}", EXIT_NO_BROKER)
    except RuntimeError as err:
        console.print(Text(f"demo failed: {err}", style="red"))
        raise typer.Exit(EXIT_RUNTIME) from None
    if isinstance(summary, RowSummary):
        print_row_summary(summary, console)
        if not summary.exit_codes_ok():
            raise typer.Exit(EXIT_RUNTIME)
        return
    print_summary(summary, console)
    if summary.valvey_exit_code not in (0, None):
        raise typer.Exit(EXIT_RUNTIME)


@app.command(short_help="Send a spool to an InfluxDB.")
def replay(
    spool: Annotated[Path, typer.Argument(help="spool / embedded-store folder")],
    url: Annotated[str, typer.Option(help="InfluxDB URL, e.g. http://influx:8086")],
    org: Annotated[str, typer.Option()] = "rackplane",
    bucket: Annotated[str, typer.Option()] = "rackplane",
    token_env: Annotated[str | None, typer.Option(help="env var holding the API token")] = None,
    api: Annotated[str, typer.Option(
        help="v2: /api/v2/write (org, bucket, token); v1: InfluxDB 1.x /write (database, "
        "retention policy, username + password env)")] = "v2",
    database: Annotated[str, typer.Option(help="v1: the database")] = "rackplane",
    retention_policy: Annotated[str | None, typer.Option(help="v1: the retention policy")
                                ] = None,
    username: Annotated[str | None, typer.Option(help="v1: the user (HTTP Basic)")] = None,
    password_env: Annotated[str | None, typer.Option(
        help="v1: env var holding the user's password")] = None,
    give_up: Annotated[float, typer.Option(
        "--give-up", min=1.0, max=3600.0,
        help="stop after this many seconds without progress (REFERENCE §8: 180)")] = 180.0,
) -> None:
    """Send a spool (the embedded store) to an InfluxDB (v2 write API, or 1.x /write with
    --api v1); exit 1 when it stops early (database unreachable for --give-up seconds, or
    refused the settings)."""
    from rackplane.io.tsdb import replay as do_replay

    configure_logging("warning", "console")
    err_console = Console(stderr=True, soft_wrap=True)
    try:
        v1 = {"database": database, "retention_policy": retention_policy,
              "username": username, "password_env": password_env} if api == "v1" else {}
        settings = TsdbSettings.model_validate(
            {"url": url, "org": org, "bucket": bucket, "token_env": token_env, "api": api,
             "replay_give_up_s": give_up, **v1})
    except ValueError as err:
        _fail(f"invalid option: {_one_line(err)}", EXIT_CONFIG)
    console = Console()
    seen_retries = 0
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"replaying to {url}", total=None)

        def on_progress(result: Any) -> None:
            nonlocal seen_retries
            sent = getattr(result, "sent_lines", 0)
            left = getattr(result, "remaining_lines", 0)
            progress.update(task, completed=sent, total=(sent + left) or None)
            retries = getattr(result, "retries", 0)
            if retries > seen_retries:
                seen_retries = retries
                progress.console.print(
                    Text(f"{url} not answering: retry {retries} (gives up after {give_up:g} s "
                         "without progress)"), highlight=False)

        try:
            result = asyncio.run(do_replay(spool, settings, progress=on_progress))
        except ConfigError as err:
            fail_config(err)
            return
        except SpoolError as err:
            err_console.print(Text(f"replay failed: {err}"), highlight=False)
            raise typer.Exit(EXIT_CONFIG) from None
    fields = result.__dict__ if hasattr(result, "__dict__") else {
        k: getattr(result, k) for k in getattr(result, "__slots__", ())
    }
    table = Table(title=f"replay of {spool} to {url}")
    table.add_column("")
    table.add_column("value")
    for k, v in fields.items():
        table.add_row(k.replace("_", " "), str(v))
    console.print(table)
    if getattr(result, "error", None):
        _fail(f"replay stopped early: {result.error} (a later replay resumes)", EXIT_RUNTIME)


def _one_line(err: Exception) -> str:
    """A pydantic ValidationError as one line ``field: message; ...`` (no links), else
    ``str(err)``."""
    errors = getattr(err, "errors", None)
    if callable(errors):
        try:
            parts = [f"{'.'.join(str(p) for p in e.get('loc', ())) or '-'}: {e.get('msg', '')}"
                     for e in errors()]
        except Exception:  # fall back to the plain text
            parts = []
        if parts:
            return "; ".join(parts)
    return str(err).splitlines()[0] if str(err) else type(err).__name__


@app.command(short_help="Run scenarios in lock-step with the simulators.",
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def lockstep(
    ctx: typer.Context,
    scenario: Annotated[str, typer.Argument(
        help="valvey: bundled scenario name or TOML path; racky: run | validate (its options "
        "follow, e.g. `run flapping-link --duration 600`, `validate --stage rack --out DIR`)")
    ] = "load-step",
    daemon: Annotated[str, typer.Option(
        "--daemon", "-d", help="whose core runs in lock-step: valvey or racky")] = "valvey",
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="valvey config (valvey only)")] = None,
) -> None:
    """Run a daemon's scenarios in lock-step with the simulators (no sockets).

    valvey: runs SCENARIO and prints the scenario report's figures and the step errors on the
    measured supply temperature. racky: "run SCENARIO" prints a summary; "validate --stage
    node|rack|multi-rack --out DIR" writes the validation report (exit 1 when it fails).

    \f
    valvey: `harness.lockstep_valvey.figures`; racky: `harness.lockstep_racky`."""
    if daemon == "racky":
        if config is not None:
            _fail("--config is valvey's; racky's lock-step runs take their own options",
                  EXIT_USAGE)
        from harness.lockstep_racky import main as racky_main

        if scenario == "load-step" and not ctx.args:  # valvey's default: nothing asked of racky
            racky_main(["--help"])
            raise typer.Exit(EXIT_USAGE)
        try:
            code = racky_main([scenario, *ctx.args])
        except ConfigError as err:
            fail_config(err)
            return
        raise typer.Exit(code)
    if daemon != "valvey":
        _fail(f"--daemon {daemon!r}: expected valvey or racky", EXIT_USAGE)
    if ctx.args:
        _fail(f"unexpected arguments for valvey: {' '.join(ctx.args)}", EXIT_USAGE)
    _lockstep_valvey(scenario, config)


def _lockstep_valvey(scenario: str, config: Path | None) -> None:
    from harness.lockstep_valvey import figures as report_figures
    from harness.lockstep_valvey import run_valvey
    from sims.metrics import step_metrics
    from sims.scenario import load_scenario
    from valvey.app import load_valvey_config

    try:
        sc = load_scenario(scenario)
        cfg = None if config is None else load_valvey_config(config)[0]  # None: the defaults
    except ConfigError as err:
        fail_config(err)
        return
    console = Console()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"{sc.name} in lock-step", total=1.0)
        res = run_valvey(sc, cfg, progress=lambda f: progress.update(task, completed=f))
    tr = res.trace
    figures: dict[str, Any] = {"report": report_figures(res)}
    ld = sc.load
    if ld.kind == "step" and ld.step_at_s is not None:
        pv: dict[str, Any] = {"step_up": step_metrics(
            tr.t_s, tr.supply_temp_c, tr.setpoint_c, ld.step_at_s, ld.back_at_s).as_dict()}
        if ld.back_at_s is not None:
            pv["step_down"] = step_metrics(
                tr.t_s, tr.supply_temp_c, tr.setpoint_c, ld.back_at_s).as_dict()
        figures["measured_pv"] = pv
    figures["alarm_events"] = res.alarm_events

    def rounded(x: Any) -> Any:
        if isinstance(x, float):
            return round(x, 3)
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [rounded(v) for v in x]
        return x

    console.print_json(json.dumps(rounded(figures), default=str))


def main() -> None:
    """The console entry point; a closed stdout ends any verb quietly with status 141
    (`rackctl.stdout.run_closing_quietly`)."""
    run_closing_quietly(app)


# --- benchmarks and the scenario report (issue 8: harness/bench.py, harness/report.py) --------


def _lazy_main(module: str) -> Any:
    """``harness.<module>.main``, imported only when its command runs (the CLI works without
    the harness). A missing module or ``main`` is a clear error, exit 2."""
    import importlib

    try:
        mod = importlib.import_module(f"harness.{module}")
    except ModuleNotFoundError as err:
        if err.name not in (f"harness.{module}", "harness"):
            raise  # a dependency of the module is missing: show the real error
        _fail(f"harness.{module} is not installed in this build (no module {err.name})",
              EXIT_USAGE)
    fn = getattr(mod, "main", None)
    if not callable(fn):
        _fail(f"harness.{module} has no main()", EXIT_USAGE)
    return fn


@app.command("bench", short_help="Run the benchmarks.")
def bench(
    out: Annotated[Path, typer.Option("--out", help="folder for results.json, results.md "
                                      "and plots")],
    quick: Annotated[bool, typer.Option("--quick", help="shorter runs (a smoke test)")] = False,
    only: Annotated[list[str] | None, typer.Option(
        "--only", help="run only this section (lockstep, callgrind, rlc, ingest, receive path, "
        "restart, modbus, tsdb, rlc fleet, row, chaos); repeat for several")] = None,
    chaos_failovers: Annotated[int, typer.Option(
        "--chaos-failovers", min=1, max=200,
        help="failovers of each kind in the chaos section (3 with --quick)")] = 20,
) -> None:
    """Run the benchmarks (harness/bench.py) into OUT; exit 0 when every figure meets its
    target, 1 otherwise, 2 when the benchmarks are not available."""
    bench_main = _lazy_main("bench")
    raise SystemExit(bench_main(out=out, quick=quick, only=list(only) if only else None,
                                chaos_failovers=chaos_failovers))


@app.command("scenarios", short_help="Run the standard scenarios into a report.")
def scenarios(
    out: Annotated[Path, typer.Option("--out", help="folder for the scenario report")],
    quick: Annotated[bool, typer.Option("--quick", help="fewer seeds, shorter traces")
                     ] = False,
    only: Annotated[list[str] | None, typer.Option(
        "--only", help="report only this scenario (S1 or load-step), daemon (valvey, racky) "
        "or figure-name prefix; repeat for several. A daemon's runner that cannot produce a "
        "requested scenario is skipped; one that runs still runs all its scenarios")] = None,
) -> None:
    """Run the standard scenarios and write their report (harness/report.py) into OUT; exit
    0 when every figure passes, 1 otherwise, 2 when the report is not available."""
    report_main = _lazy_main("report")
    raise SystemExit(report_main(out=out, quick=quick, only=list(only) if only else None))


# --- commands to the daemons, and watching them (rackctl/client.py) --------------------------

JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]


def _client_settings(config: Path | None, **flags: Any) -> Any:
    from rackctl.client import load_client_settings

    flags = {k: (str(v) if isinstance(v, Path) else v) for k, v in flags.items()}
    try:
        settings = load_client_settings(flags, config=config)
    except ConfigError as err:
        _fail(f"settings: {err}", EXIT_USAGE)
    for name in ("ca_file", "cert_file", "key_file"):
        path = getattr(settings, name)
        if path is not None and not Path(path).is_file():
            _fail(f"settings: {name}: {path}: no such file", EXIT_USAGE)
    return settings


def _fail(message: str, code: int) -> NoReturn:
    Console(stderr=True, soft_wrap=True).print(Text(message), highlight=False)
    raise typer.Exit(code)


@app.command("cmd", short_help="Send one command to a daemon.")
@connection_options()
def cmd(
    daemon: Annotated[str, typer.Argument(help="daemon name, e.g. valvey or racky")],
    verb: Annotated[str, typer.Argument(help="verb, e.g. get_state, set_setpoint")],
    arg: Annotated[list[str] | None, typer.Option(
        "--arg", "-a", help="argument key=value (value read as JSON if it parses); repeat")
    ] = None,
    args: Annotated[str | None, typer.Option("--args", help="all arguments as a JSON object")
                    ] = None,
    request_id: Annotated[str | None, typer.Option(
        help="reuse an id to retry safely (never applied twice)")] = None,
    json_out: JsonOpt = False,
    conn: Connection = NO_OPTIONS,
) -> None:
    """Send one command to a daemon and print its reply (docs/COMMANDS.md).

    Example: rackctl cmd valvey set_setpoint --arg setpoint_c=44 --rack r12
    """
    from rackctl.client import (
        BrokerRefused,
        BrokerUnavailable,
        CommandClient,
        PayloadTooLarge,
        ReplyTimeout,
        parse_args,
        validate_request_id,
    )
    from rackctl.presence import DaemonNeverConnected, Presence
    from rackplane.io.mqtt import PublishRefused

    configure_logging("error", "console")
    try:
        payload = parse_args(arg or [], args)
        if request_id is not None:
            validate_request_id(request_id)
    except ValueError as err:
        _fail(str(err), EXIT_USAGE)
    settings = conn.settings()
    try:
        settings.topics(daemon).cmd(settings.topic_user, verb)
    except ValueError as err:
        _fail(f"invalid daemon or verb: {_one_line(err)}", EXIT_USAGE)

    async def run() -> dict[str, Any]:
        client = CommandClient(settings)
        client.expect_replies_from(daemon)
        presence = Presence(settings, daemon)  # a rack nobody runs: said in about 1 s
        presence.attach(client)
        async with client:
            return await presence.call(client, verb, payload, request_id=request_id)

    try:
        reply = asyncio.run(run())
    except BrokerRefused as err:
        _fail(str(err), EXIT_USAGE)
    except PublishRefused as err:
        _fail(f"{err} (your user may not send this command)", EXIT_REFUSED)
    except (BrokerUnavailable, ReplyTimeout, DaemonNeverConnected) as err:
        _fail(str(err), EXIT_NO_BROKER)
    except MqttError as err:
        _fail(f"MQTT: {err}", EXIT_NO_BROKER)
    except ConfigError as err:
        _fail(f"settings: {err}", EXIT_USAGE)
    except PayloadTooLarge as err:
        _fail(str(err), EXIT_USAGE)
    except ValueError as err:  # args not JSON-serialisable, invalid topic level
        _fail(f"invalid command: {_one_line(err)}", EXIT_USAGE)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if json_out:
        sys.stdout.write(json.dumps(reply, ensure_ascii=False) + "\n")
    else:
        Console().print(reply_table(daemon, verb, reply))
    raise typer.Exit(EXIT_OK if reply.get("ok") is True else EXIT_REFUSED)


@app.command("watch", short_help="Show a daemon's status, state and alarms live.")
@connection_options(replies=False)
def watch(
    daemon: Annotated[str, typer.Argument(help="daemon name, e.g. valvey")],
    json_out: Annotated[bool, typer.Option(
        "--json", help="one JSON object per message on stdout (for scripts)")] = False,
    plain: Annotated[bool, typer.Option(
        "--plain", help="one text line per message (the default when stdout is not a "
        "terminal) instead of the live view")] = False,
    duration: Annotated[float | None, typer.Option(
        min=0.0, help="stop after this many seconds (default: until Ctrl-C)")] = None,
    conn: Connection = NO_OPTIONS,
) -> None:
    """Show a daemon's status, state and alarms live (retained values first).

    On a terminal a live view redrawn in place; otherwise (a pipe, a file) or with --plain
    one text line per message as it arrives; with --json one JSON object per message."""
    from rackctl.client import BrokerRefused, BrokerUnavailable, CommandClient, watch_filters
    from rackctl.presence import Presence
    from rackplane.io.mqtt import Message

    configure_logging("error", "console")
    settings = conn.settings()
    try:
        topics = settings.topics(daemon)
    except ValueError as err:
        _fail(f"invalid daemon: {_one_line(err)}", EXIT_USAGE)
    view = _WatchView(daemon)
    base = topics.base + "/"
    # a live view redraws in place: on a pipe or a file it showed nothing until the end
    plain = plain or not sys.stdout.isatty()

    def classify(topic: str) -> tuple[str, str]:
        rest = topic[len(base):] if topic.startswith(base) else topic
        kind, _, name = rest.partition("/")
        return kind, name

    closed: asyncio.Event

    async def run() -> None:
        nonlocal closed
        closed = asyncio.Event()
        client = CommandClient(settings)
        live: Live | None = None

        def on_message(msg: Message) -> None:
            try:
                body = msg.json() if msg.payload else None
            except ValueError:
                body = msg.payload.decode("utf-8", "replace")
            kind, name = classify(msg.topic)
            if json_out:
                line = {"topic": msg.topic, "kind": kind, "name": name or None,
                        "retained": msg.retain, "payload": body}
                if not write_lines([json.dumps(line, ensure_ascii=False)]):
                    closed.set()  # the reader left (``| head``): end the watch
                return
            view.update(kind, name, body)
            if plain:
                if not write_lines(list(view.lines(kind, name, body))):
                    closed.set()
                return
            if live is not None:
                live.update(view.render())

        for flt in watch_filters(topics):
            client.subscribe(flt, on_message, qos=1)
        presence = Presence(settings, daemon)
        presence.attach(client)

        async def say_if_absent() -> None:  # a rack nobody runs shows nothing: say so
            note = await presence.absent_note(client)
            if note is not None and live is not None:
                view.note = note
                live.update(view.render())
            elif note is not None:
                Console(stderr=True, soft_wrap=True).print(Text(note), highlight=False)

        async with client:
            if json_out or plain:
                check = asyncio.ensure_future(say_if_absent())
                await _sleep_or_forever(duration, closed)
            else:
                with Live(view.render(), refresh_per_second=4, console=Console()) as lv:
                    live = lv
                    check = asyncio.ensure_future(say_if_absent())
                    await _sleep_or_forever(duration, closed)
            check.cancel()
            with contextlib.suppress(BaseException):
                await check

    try:
        asyncio.run(run())
    except BrokerRefused as err:
        _fail(str(err), EXIT_USAGE)
    except BrokerUnavailable as err:
        _fail(str(err), EXIT_NO_BROKER)
    except ConfigError as err:
        _fail(f"settings: {err}", EXIT_USAGE)
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_OK) from None
    if closed.is_set():
        raise stdout_closed()


async def _sleep_or_forever(duration: float | None, stop: asyncio.Event) -> None:
    """Wait ``duration`` seconds (None: forever) or until ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), duration)


# --- the contract: JSON Schemas and docs/COMMANDS.md -------------------------------------------


def daemon_contracts() -> list[Any]:
    """Every daemon's `rackplane.commands.DaemonContract`, for the schemas and the docs.

    A daemon package provides ``<daemon>.commands.<daemon>_contract() -> DaemonContract``
    (verbs with roles, and its ``state/<thing>`` models)."""
    import importlib

    out = []
    for daemon in ("valvey", "racky", "rlc"):
        try:
            mod = importlib.import_module(f"{daemon}.commands")
        except ModuleNotFoundError:
            continue
        provider = getattr(mod, f"{daemon}_contract", None)
        if callable(provider):
            out.append(provider())
    return out


def shipped_schema_sets(contracts: list[Any]) -> dict[str, tuple[Path, dict[str, str]]]:
    """Every shipped schema set: package -> (its installed ``schemas`` folder, file name ->
    text). ``rackplane``: the envelope, reply, payloads and every daemon's verbs and states
    (`rackplane.commands.schema_documents`); ``sims``: the simulators' payloads."""
    from rackplane.commands import SCHEMA_DIR, schema_documents

    verb_args = {c.daemon: {v: m for v, (m, _r) in c.verbs.items()} for c in contracts}
    states = {c.daemon: dict(c.states) for c in contracts}
    sets = {"rackplane": (SCHEMA_DIR, schema_documents(verb_args, states))}
    try:
        from sims import telemetry as sim_telemetry
    except ModuleNotFoundError:  # a build without the simulators
        return sets
    sets["sims"] = (sim_telemetry.SCHEMA_DIR, sim_telemetry.schema_documents())
    return sets


@app.command("schemas", short_help="Write or check the contract's JSON Schemas.")
def schemas(
    write: Annotated[bool, typer.Option(
        "--write", help="regenerate the schema files (and --docs, if given)")] = False,
    check: Annotated[bool, typer.Option(
        "--check", help="exit 1 if a schema file (or --docs, if given) is stale")] = False,
    directory: Annotated[Path | None, typer.Option(
        "--dir", help="schema root: DIR/rackplane and DIR/sims instead of the installed "
        "packages' schemas folders")] = None,
    docs: Annotated[str | None, typer.Option(
        "--docs", help="the rendered contract (docs/COMMANDS.md): the file --write writes and "
        "--check compares; '-' is stdout")] = None,
) -> None:
    """The MQTT contract's JSON Schemas (rackplane/schemas, sims/schemas) generated from the
    models of rackplane, every daemon and the simulators, written or checked (byte for byte);
    and its rendering docs/COMMANDS.md. Without --write or --check: the rendering on
    stdout."""
    from rackplane.commands import render_markdown
    from rackplane.schemagen import stale_documents, write_documents

    if write and check:
        _fail("--write and --check exclude each other", EXIT_USAGE)
    contracts = daemon_contracts()
    text = render_markdown(contracts)
    sets = shipped_schema_sets(contracts)

    def folder(pkg: str, default: Path) -> Path:
        return default if directory is None else directory / pkg

    if write:
        for pkg, (default, documents) in sets.items():
            for p in write_documents(folder(pkg, default), documents, prune=True):
                typer.echo(f"wrote {p}", err=docs == "-")
        if docs == "-":
            typer.echo(text, nl=False)
        elif docs is not None:
            path = Path(docs)
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                typer.echo(f"wrote {path}")
        raise typer.Exit(EXIT_OK)
    if check:
        stale = [f"{pkg}: {name}" for pkg, (default, documents) in sets.items()
                 for name in stale_documents(folder(pkg, default), documents, complete=True)]
        if docs is not None and docs != "-":
            path = Path(docs)
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
        for name in stale:
            typer.echo(f"stale: {name}", err=True)
        raise typer.Exit(1 if stale else EXIT_OK)
    typer.echo(text, nl=False)


if __name__ == "__main__":  # python -m rackctl.cli (python -m rackctl is the usual way)
    main()


# The pair's views and handover, the fleet tier's view, rlc's campaigns (registered on `app`
# when imported).
from rackctl import campaign as _campaign  # noqa: E402,F401
from rackctl import fleet as _fleet  # noqa: E402,F401
from rackctl import pair as _pair  # noqa: E402,F401
