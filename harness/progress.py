"""Progress of the long harness commands (``rackctl scenarios``, ``rackctl bench``).

`progress_reporter` returns a `harness.figures.Progress` callback ``(label, fraction)`` and its
closer. On a terminal it draws one rich bar per key (the label's first word, so a part that
changes its label keeps its bar). Off a terminal (CI logs, ``nohup``, a pipe) rich draws
nothing until the end, which leaves a 20-40 minute run silent; there it prints plain lines
instead: a key's first report, each time its fraction passes another `LINE_STEP`, and its end,
each with the elapsed wall time, flushed at once.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from harness.figures import Progress

__all__ = ["LINE_STEP", "progress_reporter"]

LINE_STEP = 0.1
"""Off a terminal, a key's line is printed each time its fraction passes another tenth."""


def _key(label: str, by_first_word: bool) -> str:
    if not by_first_word or not label.strip():
        return label
    return label.split(":")[0].split()[0]


def progress_reporter(*, by_first_word: bool = True, label_width: int = 0,
                      stream: TextIO | None = None) -> tuple[Progress, Callable[[], None]]:
    """A ``(label, fraction 0..1)`` progress callback and its closer.

    ``by_first_word``: labels sharing their first word (before any ``:``) are one part;
    ``label_width``: the bar's label column width on a terminal; ``stream``: where the plain
    lines go off a terminal (default ``sys.stdout``), also what decides terminal or not.
    """
    out = stream if stream is not None else sys.stdout
    if out.isatty():
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        width = f":<{label_width}" if label_width else ""
        bar = RichProgress(TextColumn("{task.description" + width + "}"), BarColumn(),
                           TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn())
        bar.start()
        tasks: dict[str, Any] = {}

        def on_bar(label: str, fraction: float) -> None:
            key = _key(label, by_first_word)
            if key not in tasks:
                tasks[key] = bar.add_task(label, total=1.0)
            bar.update(tasks[key], completed=max(0.0, min(1.0, fraction)), description=label)

        return on_bar, bar.stop

    t0 = time.monotonic()
    said: dict[str, int] = {}

    def on_line(label: str, fraction: float) -> None:
        key = _key(label, by_first_word)
        f = max(0.0, min(1.0, fraction))
        step = 10 ** 6 if f >= 1.0 else int(f / LINE_STEP + 1e-9)
        if said.get(key, -1) >= step:
            return
        said[key] = step
        elapsed = int(time.monotonic() - t0)
        print(f"[{elapsed // 60:3d}:{elapsed % 60:02d}] {label}: {100 * f:3.0f} %"
              + (" done" if f >= 1.0 else ""), file=out, flush=True)

    return on_line, lambda: None
