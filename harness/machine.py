"""The host a run measured on, and the CPU time it took: the context line of the benchmark
results (`harness.bench`) and of the scenario report (`harness.report`)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["cpu_seconds", "machine_info", "machine_line"]


def machine_info() -> dict[str, Any]:
    """This host: ``host`` (its name, `platform.node`), ``cpu`` (model name from
    /proc/cpuinfo, else `platform.processor`), ``cores`` (`os.cpu_count`), ``ram_gb``
    (MemTotal, GiB, None when unreadable), ``python`` and ``os`` (platform strings)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "ram_gb": ram_gb,
            "python": platform.python_version(), "os": platform.platform()}


def machine_line(m: dict[str, Any]) -> str:
    """``host NAME: CPU, N cores, R GB RAM, Python V, OS`` of a `machine_info` dict."""
    return (f"host {m['host']}: {m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM, "
            f"Python {m['python']}, {m['os']}")


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children that have been waited
    for (a process pool's workers once it has shut down), `os.times`."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
