"""Smoke tests of the scenario report's plumbing (harness/report.py), with stand-in sources:
the real sources' figures are asserted by the scenario tests of each daemon."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from harness import report
from harness.figures import Figure


def _install(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: object) -> None:
    mod = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    monkeypatch.setitem(sys.modules, name, mod)


def test_missing_and_raising_sources_become_failed_figures(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[tuple[str, float]] = []

    def good(out: Path | None, progress: object, quick: bool) -> list[Figure]:
        assert quick is True and out == tmp_path
        return [Figure("valvey.S1.max_abs_error_k", 0.3, "K", 0.5, "<="),
                Figure("valvey.S3.standby_s", 0.4, "s", 1.0, "<=")]

    def boom(out: Path | None, progress: object, quick: bool) -> list[Figure]:
        raise ZeroDivisionError("no trace")

    _install(monkeypatch, "fake_valvey_src", figs=good)
    _install(monkeypatch, "fake_racky_src", figs=boom)
    sources = (("valvey", "fake_valvey_src", "figs"), ("racky", "fake_racky_src", "figs"),
               ("other", "no_such_module_here", "figs"))
    figs = report.collect(tmp_path, lambda lbl, f: seen.append((lbl, f)), True, None, sources)
    by = {f.name: f for f in figs}
    assert by["valvey.S1.max_abs_error_k"].passed is True
    assert by["racky.report.error"].passed is False
    assert "ZeroDivisionError" in by["racky.report.error"].detail
    assert by["other.report.error"].value is None
    assert "missing" in by["other.report.error"].detail
    assert any(f == 1.0 for _, f in seen)
    # --only: a scenario id keeps that scenario's figures; a daemon name keeps its source
    only = report.collect(tmp_path, lambda lbl, f: None, True, ["S3"], sources[:1])
    assert [f.name for f in only] == ["valvey.S3.standby_s"]
    only = report.collect(tmp_path, lambda lbl, f: None, True, ["pump-trip"], sources[:1])
    assert [f.name for f in only] == ["valvey.S3.standby_s"]
    only = report.collect(tmp_path, lambda lbl, f: None, True, ["racky"], sources)
    assert [f.name for f in only] == ["racky.report.error"]


def test_only_matches_scenario_variants_not_longer_ids() -> None:
    assert report._matches("racky.S6a.detect_s", ["S6"])
    assert report._matches("racky.S10.cap_s", ["psu-failure"])
    assert not report._matches("racky.S10.cap_s", ["S1"])
    assert report._matches("valvey.S1.max_abs_error_k", ["valvey.S1"])


def test_main_writes_results_even_when_sources_fail(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(report, "SOURCES", (("valvey", "no_such_module_here", "f"),
                                            ("racky", "no_such_module_either", "f")))
    rc = report.main(tmp_path / "skip", True, ["racky"])  # valvey's source is not run
    names = [d["name"] for d in json.loads((tmp_path / "skip" / "results.json").read_text())]
    assert names == ["racky.report.error"]
    rc = report.main(tmp_path / "out", True, None)
    assert rc == 1
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data[0]["name"] == "valvey.report.error" and data[0]["pass"] is False
    assert "valvey.report.error" in (tmp_path / "out" / "results.md").read_text()


def test_only_skips_a_source_that_cannot_yield_the_requested_scenarios(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--only S1`` must not run racky's scenarios (S1 is valvey's alone), nor ``--only S8``
    valvey's; a filter the report cannot place still runs every source."""
    ran: list[str] = []

    def src(daemon: str) -> object:
        def figs(out: Path | None, progress: object, quick: bool) -> list[Figure]:
            ran.append(daemon)
            return [Figure(f"{daemon}.S1.x", 1.0, "", 2.0, "<="),
                    Figure(f"{daemon}.S8.y", 1.0, "", 2.0, "<=")]
        return figs

    _install(monkeypatch, "fake_v", figs=src("valvey"))
    _install(monkeypatch, "fake_r", figs=src("racky"))
    sources = (("valvey", "fake_v", "figs"), ("racky", "fake_r", "figs"))
    for only, want in ((["S1"], ["valvey"]), (["load-step"], ["valvey"]),
                       (["rising-crc"], ["racky"]), (["racky.S8"], ["racky"]),
                       (["S1", "S10"], ["valvey", "racky"]), (["S9"], ["valvey", "racky"]),
                       (["weird"], ["valvey", "racky"]), (["valvey"], ["valvey"])):
        ran.clear()
        report.collect(tmp_path, lambda lbl, f: None, True, only, sources)
        assert ran == want, only


def test_results_name_the_host_and_the_run_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The first line of results.md names the host it ran on (name, CPU model, cores) and the
    wall and CPU time of this run; machine.json carries them, measured, not typed in."""
    import os
    import time

    from harness.machine import machine_info

    def slow(out: Path | None, progress: object, quick: bool) -> list[Figure]:
        c_end = time.process_time() + 0.3
        while time.process_time() < c_end:  # 0.3 CPU-s, hence at least 0.3 s wall
            pass
        return [Figure("valvey.S1.x", 1.0, "K", 2.0, "<=")]

    _install(monkeypatch, "fake_slow", figs=slow)
    monkeypatch.setattr(report, "SOURCES", (("valvey", "fake_slow", "figs"),))
    t0 = time.monotonic()
    assert report.main(tmp_path, True, None) == 0
    elapsed = time.monotonic() - t0
    m = machine_info()
    first = (tmp_path / "results.md").read_text().splitlines()[2]
    assert f"host {m['host']}: {m['cpu']}, {m['cores']} cores" in first
    assert "s wall" in first and "CPU-s" in first and "quick mode" in first
    info = json.loads((tmp_path / "machine.json").read_text())
    assert info["host"] == m["host"] and info["complete"] is True
    assert 0.3 <= info["wall_s"] <= elapsed + 0.1
    assert 0.3 <= info["cpu_s"] <= elapsed * (os.cpu_count() or 1) + 0.1
