"""Two daemons from one folder never share a spool, ``--check-config`` reports a spool held by
another process, and a writer whose spool is held loses no line (issue 14 item 17)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.servers import free_port
from rackplane.clock import FakeClock
from rackplane.io.selfmetrics import telemetry_alarm_conditions
from rackplane.io.spool import Spool
from rackplane.io.tsdb import TelemetryWriter
from rackplane.settings import Identity, SpoolSettings, TsdbSettings, spool_folder

HOLDER = """
import sys, time
from rackplane.io.spool import Spool
sp = Spool(sys.argv[1])
print("held", flush=True)
time.sleep(120)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("STATE_DIRECTORY", None)
    return env


def test_default_spool_folders_are_per_daemon_and_rack() -> None:
    s = SpoolSettings()
    r1, r2 = Identity(rack="rack1"), Identity(rack="rack2")
    folders = {spool_folder(s, daemon=d, identity=i) for d in ("valvey", "racky")
               for i in (r1, r2)}
    assert len(folders) == 4
    assert spool_folder(s, daemon="valvey", identity=r1) == Path("spool/valvey-lab-row1-rack1")
    explicit = SpoolSettings(directory=Path("/data/sp"))
    assert spool_folder(explicit, daemon="valvey", identity=r1) == Path("/data/sp")
    # Under systemd the default lives in the daemon's state directory.
    assert spool_folder(s, daemon="racky", identity=r1,
                        environ={"STATE_DIRECTORY": "/var/lib/rackplane-racky"}) == \
        Path("/var/lib/rackplane-racky/spool/racky-lab-row1-rack1")


@pytest.mark.parametrize("daemon", ["valvey", "racky"])
def test_check_config_reports_a_spool_held_by_another_process(
        tmp_path: Path, daemon: str) -> None:
    spool = tmp_path / "shared-spool"
    cfg = tmp_path / f"{daemon}.toml"
    cdu = "[cdu]\nport = 5020\n" if daemon == "valvey" else ""  # what each must name
    cfg.write_text(f'[identity]\nsite = "lab"\nrack = "rack1"\n{cdu}'
                   f'[spool]\ndirectory = "{spool}"\n')
    ok = subprocess.run([sys.executable, "-m", daemon, "--config", str(cfg), "--check-config"],
                        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=_env())
    assert ok.returncode == 0, ok.stdout + ok.stderr
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(spool)],
                              stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        r = subprocess.run([sys.executable, "-m", daemon, "--config", str(cfg),
                            "--check-config"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path,
                           env=_env())
    finally:
        holder.kill()
        holder.wait()
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "spool.directory" in out and f"in use by another process (pid {holder.pid})" in out
    assert "config OK" not in out


async def test_a_writer_whose_spool_is_held_loses_no_line(tmp_path: Path) -> None:
    settings = SpoolSettings(directory=tmp_path / "spool")
    ident = {"site": "lab", "row": "row1", "rack": "rack1"}
    first = TelemetryWriter(TsdbSettings(), settings, identity_tags=ident, clock=FakeClock())
    second = TelemetryWriter(TsdbSettings(), settings, identity_tags=ident, clock=FakeClock())
    st = second.stats
    assert st.spool_ok and st.spool_fallback == str(tmp_path / "spool.2")
    assert telemetry_alarm_conditions(st)["telemetry_spool_failed"]  # said, not silent
    assert not telemetry_alarm_conditions(first.stats)["telemetry_spool_failed"]
    for i in range(300):
        second.write("pid", {}, {"seq": float(i)})
        first.write("pid", {}, {"seq": float(1000 + i)})
    await second.close(budget_s=0)
    await first.close(budget_s=0)
    assert second.stats.dropped == 0 and first.stats.dropped == 0
    for folder, base in ((tmp_path / "spool.2", 0), (tmp_path / "spool", 1000)):
        with Spool(folder, readonly=True, cursor_file="t") as sp:
            lines, _ = sp.read(1000)
        assert [f" seq={base + i} " in ln for i, ln in enumerate(lines)] == [True] * 300
    # The next writer of the spool is told about the fallback's lines.
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        third = TelemetryWriter(TsdbSettings(), settings, identity_tags=ident,
                                clock=FakeClock())
    assert [e for e in logs if e["event"] == "telemetry_spool_fallback_left"]
    await third.close(budget_s=0)


@pytest.mark.slow
def test_two_daemons_started_from_one_folder_on_defaults_do_not_collide(
        tmp_path: Path) -> None:
    """valvey and racky on their default spools (their files name only what a config must:
    identity, valvey's CDU; and the broker port), from one working directory (the new-user
    run): each its own spool, no collision, lines in both."""
    env = {**_env(), "PYTHONUNBUFFERED": "1"}
    port = free_port()  # no broker there: the daemons run on without one
    cfgs = {}
    for d in ("valvey", "racky"):
        cfgs[d] = tmp_path / f"{d}.toml"
        cdu = f"[cdu]\nport = {free_port()}\n" if d == "valvey" else ""
        cfgs[d].write_text(f'[identity]\nsite = "lab"\nrack = "rack1"\n{cdu}'
                           f'[mqtt]\nport = {port}\n')
    procs = {d: subprocess.Popen([sys.executable, "-m", d, "--config", str(cfgs[d]),
                                  "--log-format", "json"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 cwd=tmp_path, env=env) for d in ("valvey", "racky")}
    folders = {d: tmp_path / "spool" / f"{d}-lab-row1-rack1" for d in procs}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
                list(f.glob("seg-*.lp")) for f in folders.values()):
            time.sleep(0.2)
        time.sleep(2)
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        outs = {d: p.communicate(timeout=60)[0] for d, p in procs.items()}
    for d, out in outs.items():
        assert "in use by another process" not in out, out[-3000:]
        with Spool(folders[d], readonly=True, cursor_file="t") as sp:
            assert sp.depth_lines > 0, d
    assert not (tmp_path / "spool" / ".lock").exists()  # nobody used the shared ./spool


def test_fallback_reaches_selfmetrics_health(tmp_path: Path) -> None:
    """Both writers run in one event loop: the fallback does not disturb the first."""

    async def main() -> None:
        s = SpoolSettings(directory=tmp_path / "sp")
        a = TelemetryWriter(TsdbSettings(), s, identity_tags={"rack": "r"}, clock=FakeClock())
        b = TelemetryWriter(TsdbSettings(), s, identity_tags={"rack": "r"}, clock=FakeClock())
        assert a.spool_directory == tmp_path / "sp"
        assert b.spool_directory == tmp_path / "sp.2"
        await a.close(budget_s=0)
        await b.close(budget_s=0)

    asyncio.run(main())


def test_lines_left_in_the_old_shared_default_folder_are_named_at_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Upgrade: ``./spool`` was the default folder of every daemon; its lines are named."""
    from structlog.testing import capture_logs

    from tests.unit.test_daemon_frame import FakeConfig, RecordingNotifier, Tiny

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    with Spool(tmp_path / "spool") as sp:
        sp.append(["old,rack=r v=1 1767225600000000000"])
    with capture_logs() as logs:
        d = Tiny(FakeConfig(), [], notifier=RecordingNotifier())
    (line,) = [e for e in logs if e["event"] == "telemetry_spool_legacy_left"]
    assert line["folder"] == "spool" and "rackctl replay spool" in line["fix"]
    assert d.writer.spool_directory == Path("spool/tiny-lab-row1-rack1")
    asyncio.run(d.writer.close(budget_s=0))
