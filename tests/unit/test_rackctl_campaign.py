"""``rackctl campaign``'s pure parts (rackctl/campaign.py): the plan file validated as rlc does
(TOML and JSON; every refusal names its reason), the status table (rlc's texts never read as
markup) and the report (Markdown from the record with every result, a PNG of the measured
fractions where the record has them). The verbs against a real rlc:
tests/integration/test_rackctl_campaign.py."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from rackctl.campaign import PlanRefused, load_plan, render_status, write_report
from rlc.campaign_driver import campaign_summary
from rlc.config import example_topology
from rlc.core.campaign import Campaign, FailedCriterion, StageResult
from rlc.core.campaign_plan import CampaignPlan
from rlc.core.topology import compile_topology

T0 = 1_800_000_000.0
TOML = """racks = ["rack1", "rack2"]
max_racks_per_row = 2
[cdu_of]
rack1 = "c1"
rack2 = "c2"
[[stages]]
name = "multi"
kind = "multi_rack"
power_w = 50000.0
groups = [["rack1", "rack2"]]
phases = [{kind = "burn_in", duration_s = 5.0}, {kind = "backend_only", duration_s = 5.0}]
expected = {backend_fraction = {min = 0.8, max = 1.0}}
"""


def test_plan_files_toml_and_json_validated_as_rlc_does(tmp_path: Path) -> None:
    t = tmp_path / "p.toml"
    t.write_text(TOML, encoding="utf-8")
    plan = load_plan(t, example_topology())
    j = tmp_path / "p.json"
    j.write_text(json.dumps(plan), encoding="utf-8")
    assert load_plan(j, example_topology()) == plan
    assert plan["stages"][0]["expected"]["backend_fraction"] == {"min": 0.8, "max": 1.0}
    cases = {
        "notjson.json": ("{racks", "not valid JSON"),
        "bad.toml": ("racks = [", "not valid TOML"),
        "list.json": ("[1]", "a plan is a JSON object"),
        "range.toml": (TOML.replace("min = 0.8", "min = 1.2"), "expected.backend_fraction"),
        "nogroup.toml": (TOML.replace('groups = [["rack1", "rack2"]]\n', ""),
                         "needs groups"),
        "extra.toml": (TOML + "surprise = 1\n", "surprise"),
    }
    for name, (text, why) in cases.items():
        f = tmp_path / name
        f.write_text(text, encoding="utf-8")
        with pytest.raises(PlanRefused, match=why):
            load_plan(f)
    with pytest.raises(PlanRefused, match="plan file not found"):
        load_plan(tmp_path / "missing.json")
    over = tmp_path / "over.toml"  # fine by itself, but above the topology's row limit
    over.write_text(TOML.replace("50000.0", "131000.0"), encoding="utf-8")
    assert load_plan(over)["racks"]
    with pytest.raises(PlanRefused, match="can never run"):
        load_plan(over, example_topology())


def test_plan_file_of_another_suffix_missing_or_a_folder_says_so(tmp_path: Path) -> None:
    """A TOML plan named ``.yaml`` (was "not valid JSON"), a missing ``.toml`` (was "config
    file not found"), a folder (was a raw "[Errno 21]"): read, or refused with what it is."""
    expected = load_plan(_write(tmp_path / "p.toml", TOML))
    assert load_plan(_write(tmp_path / "plan.yaml", TOML)) == expected
    assert load_plan(_write(tmp_path / "plan", json.dumps(expected))) == expected
    with pytest.raises(PlanRefused, match=r"neither JSON nor TOML .*\.toml.*\.json"):
        load_plan(_write(tmp_path / "real.yaml", "racks:\n  - rack1\n"))
    for missing in ("missing.toml", "missing.yaml"):
        with pytest.raises(PlanRefused, match=r"^plan file not found: .*missing") as err:
            load_plan(tmp_path / missing)
        assert "config" not in str(err.value)
    (tmp_path / "plans").mkdir()
    with pytest.raises(PlanRefused, match=r"a folder, not a plan file") as err:
        load_plan(tmp_path / "plans")
    assert "Errno" not in str(err.value)


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _campaign() -> Campaign:
    topo = compile_topology(example_topology())
    plan = CampaignPlan.model_validate(json.loads(json.dumps(_toml_plan())))
    c = Campaign.new("c1", plan, topo)
    orders = c.step(topo, dict.fromkeys(topo.rack_ids, 20_000.0), T0, 1)
    (run_id,) = {o.run_id for o in orders.starts}
    for r, x in (("rack1", 0.93), ("rack2", 0.41)):
        c.on_started(run_id, r, T0 + 1)
        fail = () if x > 0.8 else (FailedCriterion("backend throughput", f"{x:.2f}", ">= 0.8",
                                                   ("nics:all",)),)
        c.on_result(StageResult(run_id, r, 1, not fail, fail, {"backend_fraction": x},
                                T0 + 12), T0 + 12)
    return c


def _toml_plan() -> dict[str, object]:
    import tomllib

    return tomllib.loads(TOML)


def test_status_table_and_report_with_plot(tmp_path: Path) -> None:
    c = _campaign()
    s = campaign_summary(c, T0 + 13)
    assert s["racks"]["rack2"]["status"] == "quarantined"
    assert s["racks"]["rack2"]["verdict"] == "fail" and s["racks"]["rack1"]["verdict"] == "pass"
    assert s["racks"]["rack1"]["run"] == s["racks"]["rack2"]["run"] == "multi.1"
    s["racks"]["rack1"]["blocked"] = "[bold]not markup[/x]"
    buf = io.StringIO()
    Console(file=buf, width=250).print(render_status(s))
    out = buf.getvalue()
    assert "nics:all" in out and "[bold]not markup[/x]" in out and "multi.1" in out
    results = [{**res.as_record(), "stage": run.stage} for run in c.runs.values()
               for res in run.results.values()]
    paths = write_report(tmp_path, s, c.plan.model_dump(mode="json"), results, "test")
    assert [p.name for p in paths] == ["c1.md", "c1-figures.png"]
    assert paths[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = paths[0].read_text(encoding="utf-8")
    assert "backend_fraction [0.8, 1]" in page and "backend_fraction 0.410" in page
    assert "![measured fractions" in page and page.count("| FAIL |") == 1
    # from a status reply (no results): the page, no plot
    paths = write_report(tmp_path / "st", s, None, None, "reply")
    assert [p.name for p in paths] == ["c1.md"]
    assert "no plot: the status reply" in paths[0].read_text(encoding="utf-8")
