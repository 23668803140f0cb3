"""The callgrind figures of the benchmark suite (harness/callgrind.py): the output-file parser on
stored samples (tests/data/callgrind, trimmed real outputs of valgrind 3.19 whose totals
callgrind_annotate reports as PROGRAM TOTALS), the figure's shape, the not-measured path and
the segment child's instrumentation switch. No valgrind run here (a segment takes ~15-50 s
under callgrind; ``rackctl bench`` measures them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import bench, callgrind
from harness.benchkids import callgrind_segment as child
from harness.benchkids.callgrind_segment import SEGMENTS as CHILD_SEGMENTS
from harness.benchkids.callgrind_segment import Switch
from harness.callgrind import (
    SEGMENTS,
    UNIT,
    CallgrindError,
    Measured,
    callgrind_figures,
    figure_of,
    read_total_ir,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "callgrind"


def test_total_from_summary_line() -> None:
    # valgrind's log said "Collected : 126573" for this run of /bin/true
    assert read_total_ir(DATA / "true-full.out") == 126_573


def test_total_from_totals_when_summary_is_zero() -> None:
    # the segment child stops instrumentation before the dump: callgrind 3.19 writes
    # "summary: 0"; the totals line carries the count ("Collected : 347814133" in its log)
    text = (DATA / "segment-instr-off.out").read_text()
    assert "\nsummary: 0\n" in text
    assert read_total_ir(DATA / "segment-instr-off.out") == 347_814_133


def _write(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "cg.out"
    p.write_text("# callgrind format\nversion: 1\ncreator: test\n" + body)
    return p


def test_ir_column_is_found_by_the_events_line(tmp_path: Path) -> None:
    p = _write(tmp_path, "events: Dr Ir Dw\nsummary: 5 700 9\n\nfn=(1) f\n1 5 700 9\n"
                         "totals: 5 700 9\n")
    assert read_total_ir(p) == 700


@pytest.mark.parametrize("body, why", [
    ("summary: 10\n", "no events"),
    ("events: Dr\nsummary: 10\n", "no Ir"),
    ("events: Ir\nsummary: 10\ntotals: 11\n", "disagree"),
    ("events: Ir\nsummary: 0\n", "no non-zero"),
    ("events: Ir\n", "no non-zero"),
    ("events: Dr Ir\nsummary: 10\n", "cost columns"),
])
def test_unusable_outputs_are_refused(tmp_path: Path, body: str, why: str) -> None:
    with pytest.raises(CallgrindError, match=why):
        read_total_ir(_write(tmp_path, body))


def test_figure_is_instructions_per_plant_second_against_its_ceiling(tmp_path: Path) -> None:
    seg = SEGMENTS[0]
    ir = round(0.5 * seg.ceiling * 60.0)
    ok = figure_of(seg, Measured(ir=ir, plant_s=60.0, on_s=50.0, off_s=110.0,
                                 wall_s=12.0, out_file=tmp_path / "x"))
    assert ok.name == "bench.lockstep.valvey_cdu.instructions_per_plant_s"
    assert ok.unit == UNIT == "instructions/plant s"
    assert ok.value == pytest.approx(ir / 60.0) and ok.comparison == "<="
    assert ok.passed is True
    assert "50-110" in ok.detail and f"{ir:,}" in ok.detail
    over = figure_of(seg, Measured(ir=round(2.0 * seg.ceiling * 60.0), plant_s=60.0, on_s=50.0,
                                   off_s=110.0, wall_s=12.0, out_file=tmp_path / "x"))
    assert over.passed is False


def test_figure_names_what_the_run_reported(tmp_path: Path) -> None:
    racky = next(s for s in SEGMENTS if s.key == "racky")
    base = Measured(ir=3_000_000, plant_s=3.0, on_s=10.0, off_s=13.0, wall_s=1.0,
                    out_file=tmp_path / "callgrind.out.3")
    told = figure_of(racky, Measured(**{**base.__dict__, "about": {"link_ports": 1440}}))
    assert "1,440 link ports" in told.detail and told.extra["link_ports"] == 1440
    assert "? link ports" in figure_of(racky, base).detail


def test_segments_match_the_child_and_name_their_runners() -> None:
    assert [s.key for s in SEGMENTS] == list(CHILD_SEGMENTS)
    for s in SEGMENTS:
        for quick in (True, False):
            on, off = s.span(quick)
            assert 0 <= on < off
        assert s.name.startswith("bench.lockstep.") and s.name.endswith(
            ".instructions_per_plant_s")


def test_missing_valgrind_is_not_measured_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(callgrind.shutil, "which", lambda name: None)
    figs = callgrind_figures(tmp_path, True)
    assert [f.name for f in figs] == [s.name for s in SEGMENTS]
    for f in figs:
        assert f.value is None and f.passed is False and f.unit == UNIT
        assert "not measured" in f.detail and "valgrind is not installed" in f.detail


def test_missing_compiler_is_not_measured_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "valgrind"
    fake.write_text("#!/bin/sh\nexit 1\n")
    monkeypatch.setattr(callgrind.shutil, "which", lambda name: None)
    figs = callgrind_figures(tmp_path, True, valgrind=str(fake))
    assert all(f.value is None and "no C compiler" in f.detail for f in figs)


def test_suite_section_yields_the_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    monkeypatch.setattr(callgrind.shutil, "which", lambda name: None)
    figs = bench.run_suite(tmp_path, True, only=["callgrind"])
    assert {f.name: f.unit for f in figs} == {s.name: UNIT for s in SEGMENTS}


class _Marker:
    """Stands in for the compiled marker library: records the client requests."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def rp_cg_start(self) -> None:
        self.calls.append("start")

    def rp_cg_dump_stop(self, name: bytes) -> None:
        self.calls.append(f"dump {name.decode()}")

    def rp_cg_running(self) -> int:
        return 0


def test_switch_counts_whole_ticks_between_the_two_plant_times() -> None:
    m = _Marker()
    sw = Switch(m, "valvey_cdu", 5.0, 7.0)  # type: ignore[arg-type]
    ts = [round(0.1 * k, 10) + 1e-12 * (-1) ** k for k in range(120)]  # float-noisy ticks
    for t in ts:
        sw(t)
    assert m.calls == ["start", "dump valvey_cdu"]
    assert sw.on_at == pytest.approx(5.0) and sw.off_at == pytest.approx(7.0)
    late = Switch(_Marker(), "racky", 5.0, 7.0)  # type: ignore[arg-type]
    for t in (0.0, 1.0, 6.5):  # a run that ends early never switches off
        late(t)
    assert late.on_at == 6.5 and late.off_at is None


def test_child_switches_inside_both_runners(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    """The child's hooks reach the real runners (a few plant seconds, no valgrind): one
    start/dump pair per segment, the plant seconds between the switching ticks."""
    m = _Marker()
    monkeypatch.setattr(child.ctypes, "CDLL", lambda path: m)
    out = tmp_path / "r.json"
    rc = child.main(["marker.so", str(out), "valvey_cdu:1:2.5", "racky:1:3", "valvey_rack:9:8"])
    assert rc == 2  # a segment ending before it starts is a usage error
    assert child.main(["marker.so", str(out), "valvey_cdu:1:2.5", "racky:1:3"]) == 0
    info = json.loads(out.read_text())
    cdu, racky = info["segments"]
    assert cdu["error"] is None and racky["error"] is None, info
    assert m.calls == ["start", "dump valvey_cdu", "start", "dump racky"]
    assert info["on_valgrind"] is False
    assert cdu["plant_s"] == pytest.approx(1.5) and cdu["dump"] == 1 and cdu["error"] is None
    assert racky["plant_s"] == pytest.approx(2.0) and racky["dump"] == 2
    assert isinstance(racky["link_ports"], int) and racky["link_ports"] > 0


_FAKE_VALGRIND = """#!{python}
# stands in for valgrind: writes what the segment child and callgrind would
import json, shutil, sys
args = sys.argv[1:]
out = next(a.split("=", 1)[1] for a in args if a.startswith("--callgrind-out-file="))
i = args.index("harness.benchkids.callgrind_segment")
res, specs = args[i + 2], args[i + 3:]
rows = []
for n, spec in enumerate(specs, 1):
    key, on, off = spec.split(":")
    text = open({sample!r}).read()
    trigger = "{{}}" if key != "racky" else "{{}}-other"
    text = text.replace("desc: Trigger: Program termination",
                        "desc: Trigger: Client Request: " + trigger.format(key))
    open(out + "." + str(n), "w").write(text)
    rows.append(dict(segment=key, on_s=float(on), off_s=float(off),
                     plant_s=float(off) - float(on), dump=n,
                     error="RuntimeError: boom" if key == "valvey_rack" else None))
json.dump(dict(on_valgrind={on_vg}, segments=rows), open(res, "w"))
"""


def _fake_valgrind(tmp_path: Path, on_vg: bool) -> str:
    import sys

    p = tmp_path / f"valgrind-{on_vg}"
    p.write_text(_FAKE_VALGRIND.format(python=sys.executable,
                                       sample=str(DATA / "segment-instr-off.out"),
                                       on_vg=on_vg))
    p.chmod(0o755)
    return str(p)


@pytest.mark.skipif(not callgrind.shutil.which("cc"), reason="no C compiler for the marker")
def test_parts_are_matched_to_segments_by_their_trigger(tmp_path: Path) -> None:
    figs = callgrind_figures(tmp_path / "w", False, valgrind=_fake_valgrind(tmp_path, True))
    by = {f.name: f for f in figs}
    cdu = by["bench.lockstep.valvey_cdu.instructions_per_plant_s"]
    assert cdu.value == pytest.approx(347_814_133 / 60.0)
    assert cdu.extra["callgrind_file"] == "callgrind.out.1"
    # a segment whose runner raised is not measured, with the child's reason
    rack = by["bench.lockstep.valvey_rack.instructions_per_plant_s"]
    assert rack.value is None and rack.passed is False and "boom" in rack.detail
    # a part dumped under another name is refused, not counted as this segment's
    wrong = by["bench.lockstep.racky.instructions_per_plant_s"]
    assert wrong.value is None and "racky-other" in wrong.detail
    # a child that did not run under valgrind measures nothing
    figs = callgrind_figures(tmp_path / "w2", True, valgrind=_fake_valgrind(tmp_path, False))
    assert all(f.value is None and "not run under valgrind" in f.detail for f in figs)
