"""``rackctl lockstep --daemon racky``'s argument checks (harness.lockstep_racky.main): a bad
value or a plan the validation refuses is exit 2 with the reason on stderr, never a traceback
and never a run (found by a new-user run: ``--plant-dt 0`` divided by zero, ``--load-s 0``
passed a rack that had no load phase, ``--stage node`` without trays raised)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.lockstep_racky import main


@pytest.mark.parametrize("argv", [
    ["run", "flapping-link", "--plant-dt", "0"],
    ["run", "flapping-link", "--duration", "-5"],
    ["run", "flapping-link", "--duration", "nan"],
    ["validate", "--stage", "rack", "--load-s", "0", "--out", "OUT"],
    ["validate", "--stage", "node", "--trays", "0,x", "--out", "OUT"],
])
def test_bad_values_are_refused_before_any_run(argv: list[str], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(tmp_path) if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: argument" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # no report written


@pytest.mark.parametrize(("argv", "reason"), [
    (["validate", "--stage", "node"], "needs trays"),
    (["validate", "--stage", "node", "--trays", "99"], "do not exist"),
])
def test_refused_validation_plans_name_the_reason(argv: list[str], reason: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--out", str(tmp_path)]) == 2
    assert reason in capsys.readouterr().err
