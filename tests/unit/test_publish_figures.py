"""scripts/publish_figures.py: README blocks and docs copies come from a run's results.json."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from harness.figures import Figure, write_results

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("publish_figures",
                                                  ROOT / "scripts" / "publish_figures.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(tmp: Path, figs: list[Figure]) -> Path:
    out = tmp / "run"
    write_results(out, figs, "rackplane benchmarks", "Machine: test box. Full run, 12 s wall.")
    (out / "plot.png").write_bytes(b"\x89PNG fake")
    return out


def test_block_rows_and_verdict_come_from_results_json(tmp_path: Path) -> None:
    pub = _script()
    run = _run(tmp_path, [
        Figure("bench.a", 2.0, "x", 1.0, ">="),
        Figure("bench.b", 3.0, "ms", 1.0, "<="),
        Figure("bench.info", 7.0, "n"),
    ])
    text = pub.block("bench", run, pub.load_figures(run), "docs/bench-report/results.md")
    assert "Machine: test box. Full run, 12 s wall." in text
    assert "`bench.a` | 2 |" in text and "`bench.b` | 3 |" in text
    assert "bench.info" not in text.split("\n\n", 3)[-1]  # info rows are not in the table
    assert "1 figure(s) below target: `bench.b`" in text


def test_main_rewrites_only_the_marked_block_and_copies_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pub = _script()
    run = _run(tmp_path, [Figure("bench.a", 2.0, "x", 1.0, ">=")])
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- figures:bench:start -->\nOLD\n"
                      "<!-- figures:bench:end -->\ntail\n")
    monkeypatch.setattr(pub, "ROOT", tmp_path)
    assert pub.main(["--bench", str(run), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "OLD" not in text and text.startswith("intro\n") and text.endswith("tail\n")
    assert "`bench.a` | 2 |" in text
    dest = tmp_path / "docs" / "bench-report"
    assert json.loads((dest / "results.json").read_text())[0]["name"] == "bench.a"
    assert (dest / "plot.png").is_file()
    # no marker: a clear error, the README untouched
    readme.write_text("no markers\n")
    assert pub.main(["--bench", str(run), "--readme", str(readme)]) == 2
    assert readme.read_text() == "no markers\n"


@pytest.mark.parametrize("rows", [
    [{"name": "a", "value": "NaN", "unit": "K"}],       # a string where a number belongs
    [{"name": "a", "value": True, "unit": "K"}],        # a bool is not a number
    [{"value": 1.0, "unit": "K"}],                       # no name
    [],                                                  # no figures
    {"name": "a"},                                       # not a list
])
def test_a_bad_run_publishes_nothing_and_deletes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: object) -> None:
    pub = _script()
    monkeypatch.setattr(pub, "ROOT", tmp_path)
    good = _run(tmp_path, [Figure("bench.a", 2.0, "x", 1.0, ">=")])
    readme = tmp_path / "README.md"
    readme.write_text("<!-- figures:bench:start -->\n<!-- figures:bench:end -->\n")
    assert pub.main(["--bench", str(good), "--readme", str(readme)]) == 0
    published = readme.read_text()
    dest = tmp_path / "docs" / "bench-report"
    before = sorted(p.name for p in dest.iterdir())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.json").write_text(json.dumps(rows))
    (bad / "results.md").write_text("# t\n\nMachine: x.\n")
    assert pub.main(["--bench", str(bad), "--readme", str(readme)]) == 2
    assert sorted(p.name for p in dest.iterdir()) == before
    assert json.loads((dest / "results.json").read_text())[0]["name"] == "bench.a"
    assert readme.read_text() == published
    # a run without results.md is refused the same way
    (bad / "results.json").write_text(json.dumps([{"name": "a", "value": 1.0, "unit": "K"}]))
    (bad / "results.md").unlink()
    assert pub.main(["--bench", str(bad), "--readme", str(readme)]) == 2
    assert sorted(p.name for p in dest.iterdir()) == before


def test_nothing_to_publish_is_a_usage_error(tmp_path: Path) -> None:
    pub = _script()
    with pytest.raises(SystemExit) as exc:
        pub.main(["--readme", str(tmp_path / "README.md")])
    assert exc.value.code == 2


def _demo_run(tmp: Path, racks: list[str]) -> Path:
    run = tmp / "demo-output" / "20261202-101448"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"racks": [{"rack": r} for r in racks]}))
    md = ["Row demo, 2 racks (r12, r13), run 2026-12-02 on host t; took 171 s.", ""]
    for r in racks:
        md += [f"## rack {r}", "", f"- [x] item of {r}", ""]
        (run / r).mkdir()
        (run / r / f"demo-{r}.png").write_bytes(b"\x89PNG fake")
    md += ["## the row (2 racks)", "", "- [x] row item", "", f"Row plot: {run}/row.png."]
    (run / "summary.md").write_text("\n".join(md) + "\n")
    (run / "row.png").write_bytes(b"\x89PNG fake")
    return run


def test_demo_block_is_the_runs_summary_with_its_plots_linked(tmp_path: Path) -> None:
    pub = _script()
    run = _demo_run(tmp_path, ["r12", "r13"])
    text, plots = pub.demo_block(run)
    assert [p.name for p in plots] == ["row.png", "demo-r12.png", "demo-r13.png"]
    assert text.startswith("Row demo, 2 racks") and "took 171 s" in text
    assert "### rack r12\n\n![rack r12](docs/demo/demo-r12.png)" in text
    assert text.index("](docs/demo/row.png)") < text.index("### the row")
    assert "Row plot:" not in text and "- [x] item of r13" in text
    (run / "r13" / "demo-r13.png").unlink()
    with pytest.raises(ValueError, match="plots missing"):
        pub.demo_block(run)


def test_demo_block_refuses_a_single_rack_run(tmp_path: Path) -> None:
    pub = _script()
    run = tmp_path / "one"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"rack": "r12"}))
    (run / "summary.md").write_text("x\n")
    with pytest.raises(ValueError, match="not a row run"):
        pub.demo_block(run)
