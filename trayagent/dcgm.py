"""The DCGM exporter adapter: NVIDIA's dcgm-exporter ``/metrics`` (Prometheus text exposition
format) fetched over HTTP and parsed with prometheus-client's parser (this module and
`rackplane.io.selfmetrics` are its importers), for trays whose GPUs the agent cannot reach
through NVML. A tray read this way reports ``cap_enforceable = false``: the exporter only
reads, so no cap can be applied (``set_limit`` raises).

Tolerance:

- **label renames across exporter versions**: the GPU index is the ``gpu`` label (2.x, 3.x),
  else ``GPU``, else the number of ``device="nvidiaN"``; a series with none of them is ignored;
- **metric renames**: the clock-event reasons are ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` (DCGM
  3.3+) or ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` (before); the enforced limit
  ``DCGM_FI_DEV_ENFORCED_POWER_LIMIT``, else ``DCGM_FI_DEV_POWER_MGMT_LIMIT``;
- **repeated series** (one GPU's figure under several label sets: Kubernetes pod attribution,
  a restarted exporter's duplicate): equal values are one value; different values make the
  figure unknown for that GPU (``conflicting series``), never one picked at random;
- a NaN or infinite value, a reasons value that is not an unsigned integer: that figure unknown;
- a scrape that fails (HTTP error, timeout, not the text format): every GPU unknown for the
  cycle, with the reason.

Units: the exporter gives W (power, limits), mJ (energy), °C, percent.
"""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from trayagent.core.caps import DeviceLimits
from trayagent.core.payload import GpuReading
from trayagent.core.throttle import decode_clock_events
from trayagent.sources import SourceError

__all__ = ["METRICS", "DcgmError", "DcgmSource", "parse_exporter_text"]

METRICS: dict[str, tuple[str, ...]] = {
    "power_w": ("DCGM_FI_DEV_POWER_USAGE",),
    "energy_mj": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",),
    "temp_c": ("DCGM_FI_DEV_GPU_TEMP",),
    "utilization_pct": ("DCGM_FI_DEV_GPU_UTIL",),
    "reasons": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
    "limit_w": ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT"),
    "min_w": ("DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN",),
    "max_w": ("DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX",),
    "default_w": ("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF",),
}
"""figure -> exporter metric names, preferred first."""

_BY_METRIC = {m: (fig, rank) for fig, names in METRICS.items() for rank, m in enumerate(names)}
_DEVICE_RE = re.compile(r"^nvidia([0-9]{1,4})$")


class DcgmError(SourceError):
    """The exporter could not be scraped or its answer parsed; or a cap was asked of it."""


def _gpu_index(labels: dict[str, str]) -> int | None:
    for k in ("gpu", "GPU"):
        v = labels.get(k)
        if v is not None and v.isascii() and v.isdigit():
            return int(v)
    m = _DEVICE_RE.fullmatch(labels.get("device", ""))
    return int(m.group(1)) if m else None


@dataclass(slots=True)
class _Figure:
    rank: int
    values: set[float] = field(default_factory=set)


def parse_exporter_text(text: str) -> dict[int, dict[str, float | str]]:
    """GPU index -> figure -> value (a float) or why it is unknown (a str), from the
    exporter's text (module docstring: renames, repeated series).

    Raises:
        DcgmError: not the Prometheus text format.
    """
    found: dict[int, dict[str, _Figure]] = defaultdict(dict)
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                hit = _BY_METRIC.get(s.name)
                if hit is None and s.name.endswith("_total"):
                    # prometheus-client names a counter's samples <name>_total even when the
                    # exporter wrote <name> (TYPE counter): the exporter's name counts
                    hit = _BY_METRIC.get(s.name[:-6])
                if hit is None:
                    continue
                fig, rank = hit
                gpu = _gpu_index(s.labels)
                if gpu is None:
                    continue
                cur = found[gpu].get(fig)
                if cur is None or rank < cur.rank:
                    cur = found[gpu][fig] = _Figure(rank)
                elif rank > cur.rank:
                    continue  # an older name beside the newer one: the newer wins
                cur.values.add(float(s.value))
    except ValueError as err:
        raise DcgmError(f"DCGM exporter: not the Prometheus text format ({err})") from None
    out: dict[int, dict[str, float | str]] = {}
    for gpu, figs in found.items():
        row: dict[str, float | str] = {}
        for fig, f in figs.items():
            vals = f.values
            if len(vals) > 1:
                row[fig] = f"conflicting series ({', '.join(f'{v:g}' for v in sorted(vals))})"
                continue
            v = next(iter(vals))
            row[fig] = v if math.isfinite(v) else f"not finite ({v})"
        out[gpu] = row
    return out


class DcgmSource:
    """The GPUs of this host through a DCGM exporter's ``url`` (module docstring).

    Args:
        url: the exporter's metrics URL (e.g. ``http://127.0.0.1:9400/metrics``).
        timeout_s: the HTTP timeout, s.
    """

    cap_enforceable = False

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._rows: dict[int, dict[str, float | str]] = {}
        self._error: str | None = "not scraped yet"

    def _fetch(self) -> str:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:
                return str(resp.read(8 * 1024 * 1024).decode("utf-8", errors="replace"))
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise DcgmError(f"DCGM exporter {self.url}: {err}") from None

    def open(self) -> int:
        """Scrape once; the number of GPUs in the answer.

        Raises:
            DcgmError: the exporter did not answer with its text.
        """
        self._rows = parse_exporter_text(self._fetch())
        self._error = None
        return len(self._rows)

    def refresh(self) -> None:
        """Scrape for this cycle; a failed scrape makes every GPU unknown (never the last
        values)."""
        try:
            self._rows = parse_exporter_text(self._fetch())
            self._error = None
        except DcgmError as err:
            self._rows = {}
            self._error = str(err)

    def read(self, index: int, gpu: int) -> GpuReading:
        """GPU ``index`` (the exporter's ``gpu`` label) of the last scrape as rack GPU
        ``gpu``; each figure None with its reason where unknown."""
        r = GpuReading(gpu=gpu, power_kind="average")
        row = self._rows.get(index)
        if row is None:
            why = self._error or f"GPU {index} not in the exporter's answer"
            for f in ("power_w", "limit_w"):
                r.errors[f] = why
            return r

        def num(fig: str) -> float | None:
            v = row.get(fig)
            if isinstance(v, float):
                return v
            r.errors[fig] = v if isinstance(v, str) else "not exported"
            return None

        r.power_w = num("power_w")
        e = num("energy_mj")
        r.energy_mj = int(e) if e is not None and 0 <= e < 2**64 else None
        r.temp_c = num("temp_c")
        u = num("utilization_pct")
        r.utilization = None if u is None else u / 100.0
        m = num("reasons")
        if m is not None:
            if m.is_integer() and 0 <= m < 2**64:
                d = decode_clock_events(int(m))
                r.reasons, r.unknown_reason_bits = d.names, d.unknown_bits
            else:
                r.errors["reasons"] = f"not a bit mask: {m:g}"
        r.limit_w = num("limit_w")
        r.limits = DeviceLimits(num("min_w"), num("max_w"), num("default_w"))
        return r

    def set_limit(self, index: int, watts: float) -> None:
        """Always raises: the exporter only reads.

        Raises:
            DcgmError: always.
        """
        raise DcgmError(f"device {index}: read through the DCGM exporter, no cap can be set")

    def close(self) -> None:
        """Nothing to close (one HTTP request per scrape)."""
