"""racky's validation report never loses its verdict and criteria because a plot could not be
drawn (issue 14 item 20's kind, acceptance round 2): a plot that raised while drawing (a
backend error, a failing savefig) took the whole report.md with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from racky.core.validation import Criterion, ValidationResult, ValidationSample
from racky.report import write_report


def _result() -> ValidationResult:
    samples = [ValidationSample(float(t), "load", 90_000.0, 120_000.0, 264_000.0, 70.0, 12.0,
                                0, 0.5, 0.4, 0.3, 0, 0, 0.0) for t in range(5)]
    return ValidationResult("rack", "rack1", None, True,
                            [Criterion("thermal under load", True, "12 K", ">= 3 K")], samples)


def test_a_plot_that_fails_to_draw_keeps_the_report(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.figure import Figure

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the plot backend fell over")

    monkeypatch.setattr(Figure, "savefig", broken)
    p = write_report([_result()], tmp_path)
    text = p.read_text()
    assert "**Verdict: PASS**" in text and "thermal under load" in text
    assert "the plot backend fell over" in text and ".png" not in text


def test_plots_are_drawn_when_they_can_be(tmp_path: Path) -> None:
    text = write_report([_result()], tmp_path).read_text()
    assert ".png" in text and list(tmp_path.glob("*.png"))
