"""`harness.progress`: off a terminal, long runs print plain progress lines (not silence)."""

from __future__ import annotations

import io

from harness.progress import progress_reporter


class _Pipe(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_off_a_terminal_each_tenth_and_the_end_is_a_line() -> None:
    out = _Pipe()
    progress, close = progress_reporter(stream=out)
    for i in range(41):  # 0, 0.025, ..., 1.0: each tenth once, repeats not printed
        progress("valvey: S1 load step", i / 40)
    progress("racky", 0.05)
    progress("racky", 1.0)
    progress("racky", 1.0)
    close()
    lines = out.getvalue().splitlines()
    valvey = [ln for ln in lines if "valvey" in ln]
    assert [ln.split(": ")[-1].strip() for ln in valvey] == [
        f"{p} %" for p in range(0, 100, 10)] + ["100 % done"]
    assert [ln.split("racky: ")[1] for ln in lines if "racky" in ln] == ["  5 %", "100 % done"]
    assert all(ln.startswith("[  0:0") for ln in lines)


def test_labels_of_one_part_share_its_steps_unless_asked_otherwise() -> None:
    out = _Pipe()
    progress, _ = progress_reporter(stream=out)
    progress("valvey: S1", 0.5)
    progress("valvey: S2", 0.55)  # same part (first word), same tenth: not repeated
    assert out.getvalue().count("\n") == 1
    out2 = _Pipe()
    progress2, _ = progress_reporter(stream=out2, by_first_word=False)
    progress2("valvey: S1", 0.5)
    progress2("valvey: S2", 0.55)
    assert out2.getvalue().count("\n") == 2
