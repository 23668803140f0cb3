"""Link-only harness: per-link error counts in 1-minute bins for false-alarm and delay statistics.

REFERENCE §3.3's setting: per-link error counts in 1-minute bins, Poisson, with a rate profile
(healthy λ0 = 0.5/min, steps, ramps). The harness streams N links × M minutes in chunks of at
most ``max_chunk_elements`` counts (memory bounded), link block by link block and, within a
block, in time order, and hands each chunk to a detector (detector-agnostic: anything with the
`ChunkDetector` call signature). It only generates counts and tallies alarms; the production
detector is racky's. `PoissonCusum` is a pure reference implementation of §3.3's CUSUM,
vectorised across links, used to validate the harness against §3.3's table.

Usage::

    profile = RateProfile.ramp(0.5, 5.0, start_min=0, duration_min=1440)   # S8 slow creep
    result = run(profile, n_links=300, n_minutes=600,
                 detector_factory=cusum_factory(0.5, 2.0, h=8.0), seed=1)
    delays = detection_delays_min(result.first_alarm_min, onset_min=0)    # §3.3: ≈ 207 / 254

    result = run(RateProfile.healthy(), n_links=100_000, n_minutes=1440,
                 detector_factory=cusum_factory(0.5, 2.0, h=12.0))        # 100,000 link-days
    result.total_alarms                                                   # S8: ≤ 3

Conventions. Bin ``m`` covers minutes ``[m, m + 1)``; its count is Poisson with mean the
integral of the profile's rate over the bin (exact for piecewise-linear profiles, steps and
ramps alike). A detector alarm in bin ``m`` is raised at the end of that bin, so the delay of
a change starting at minute ``onset`` is ``m + 1 − onset`` minutes. Counts for one link block
come from ``numpy.random.Generator(PCG64(SeedSequence([seed, block])))`` in time order, so the
same (seed, ``link_block``) gives the same counts whatever the minute chunking.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

__all__ = [
    "ChunkDetector",
    "CountChunk",
    "DetectorFactory",
    "HarnessResult",
    "PoissonCusum",
    "RateProfile",
    "cusum_factory",
    "cusum_reference_value",
    "detection_delays_min",
    "iter_counts",
    "quantiles",
    "run",
]

#: REFERENCE §3.3 healthy per-link baseline, errors/min [D].
LAMBDA0_PER_MIN = 0.5
#: Default bound on counts held at once (int64: 32 MB).
DEFAULT_MAX_CHUNK_ELEMENTS = 4_000_000
#: Default links per block (a block's detector state lives across its minute chunks).
DEFAULT_LINK_BLOCK = 16_384


@dataclass(frozen=True, slots=True)
class RateProfile:
    """Error rate (errors/min) vs time (min), piecewise linear through ``points``.

    ``points`` are ``(minute, rate_per_min)`` with non-decreasing minutes; a repeated minute is
    a step. Before the first point the first rate holds, after the last the last rate holds.
    Raises ValueError for no points, decreasing minutes, or negative / non-finite values.
    """

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a rate profile needs at least one (minute, rate) point")
        prev = -math.inf
        for t, r in self.points:
            if not (math.isfinite(t) and math.isfinite(r) and r >= 0.0):
                raise ValueError(f"profile point ({t}, {r}) must be finite with rate >= 0")
            if t < prev:
                raise ValueError("profile minutes must be non-decreasing")
            prev = t

    @classmethod
    def healthy(cls, lambda0_per_min: float = LAMBDA0_PER_MIN) -> RateProfile:
        """Constant rate λ0 (REFERENCE §3.3: 0.5/min)."""
        return cls(((0.0, float(lambda0_per_min)),))

    @classmethod
    def step(cls, lambda0_per_min: float, lambda1_per_min: float, at_min: float) -> RateProfile:
        """λ0 until ``at_min``, λ1 from then on (REFERENCE §3.3 rows "step to ...")."""
        return cls(((float(at_min), float(lambda0_per_min)), (float(at_min),
                                                              float(lambda1_per_min))))

    @classmethod
    def ramp(
        cls, lambda0_per_min: float, lambda1_per_min: float, start_min: float,
        duration_min: float,
    ) -> RateProfile:
        """λ0 until ``start_min``, linear to λ1 over ``duration_min``, then λ1 (REFERENCE §5 S8:
        0.5 → 5/min over 24 h; fast 0.5 → 10/min over 2 h). Raises ValueError if
        ``duration_min`` <= 0."""
        if not duration_min > 0.0:
            raise ValueError(f"duration_min must be > 0 (got {duration_min})")
        return cls(((float(start_min), float(lambda0_per_min)),
                    (float(start_min + duration_min), float(lambda1_per_min))))

    def rate_per_min(self, t_min: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Instantaneous rate at ``t_min`` (any shape), errors/min (right-continuous)."""
        x, y, _ = self._knots()
        t = np.asarray(t_min, dtype=np.float64)
        i = np.clip(np.searchsorted(x, t, side="right") - 1, 0, len(x) - 1)
        nxt = np.minimum(i + 1, len(x) - 1)
        span = x[nxt] - x[i]
        with np.errstate(invalid="ignore", divide="ignore"):
            w = np.where(span > 0.0, (t - x[i]) / span, 0.0)
        inside = (t >= x[0]) & (i < len(x) - 1)
        return np.where(inside, y[i] + (y[nxt] - y[i]) * w, np.where(t < x[0], y[0], y[-1]))

    def cumulative(self, t_min: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Integral of the rate from the first point's minute to ``t_min`` (expected errors;
        negative before the first point)."""
        x, y, f = self._knots()
        t = np.asarray(t_min, dtype=np.float64)
        i = np.clip(np.searchsorted(x, t, side="right") - 1, 0, len(x) - 1)
        r = self.rate_per_min(t)
        after = f[i] + (t - x[i]) * np.where(i < len(x) - 1, 0.5 * (y[i] + r), y[-1])
        return np.where(t < x[0], (t - x[0]) * y[0], after)

    def bin_means(self, minute_start: int, n_minutes: int) -> npt.NDArray[np.float64]:
        """Expected count per 1-minute bin ``minute_start .. minute_start + n_minutes − 1``,
        shape (n_minutes,)."""
        edges = np.arange(minute_start, minute_start + n_minutes + 1, dtype=np.float64)
        return np.maximum(np.diff(self.cumulative(edges)), 0.0)

    def _knots(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64],
                              npt.NDArray[np.float64]]:
        x = np.array([p[0] for p in self.points], dtype=np.float64)
        y = np.array([p[1] for p in self.points], dtype=np.float64)
        f = np.concatenate(([0.0], np.cumsum(np.diff(x) * 0.5 * (y[:-1] + y[1:]))))
        return x, y, f


@dataclass(frozen=True, slots=True)
class CountChunk:
    """Counts of links ``link_start .. link_stop − 1`` for minutes ``minute_start ..
    minute_start + counts.shape[1] − 1``; ``counts`` has shape (links, minutes), int64, and
    may be a non-contiguous (transposed) view: column access ``counts[:, j]`` is contiguous;
    float64 with NaN for unknown bins when the run has some (``unknown_min``)."""

    link_start: int
    link_stop: int
    minute_start: int
    counts: npt.NDArray[np.int64] | npt.NDArray[np.float64]


class ChunkDetector(Protocol):
    """A detector for one link block, fed that block's chunks in time order.

    Called (positionally; any callable of this shape fits) with ``counts`` (links, minutes)
    and the chunk's first minute; returns a bool
    array of the same shape, True where it raises an alarm (at the end of that bin), or None
    for no alarm in the chunk. It keeps its own state between calls (and decides itself
    whether it re-arms after an alarm).
    """

    def __call__(
        self, counts: npt.NDArray[np.int64] | npt.NDArray[np.float64], minute_start: int, /
    ) -> npt.NDArray[np.bool_] | None: ...


#: Builds a fresh `ChunkDetector` for a block of ``n_links`` links.
DetectorFactory = Callable[[int], ChunkDetector]


@dataclass(frozen=True, slots=True)
class HarnessResult:
    """What `run` tallied.

    ``first_alarm_min``: per link, the bin index of its first alarm, or −1; shape (n_links,).
    ``alarm_count``: per link, the number of alarm bins; shape (n_links,).
    ``total_errors``: errors generated (a check on the rate profile).
    ``counted_link_minutes``: known (non-NaN) link-minutes from ``count_from_min`` on, the
    exposure the alarm counts are over (an output of the run).
    """

    n_links: int
    n_minutes: int
    first_alarm_min: npt.NDArray[np.int64]
    alarm_count: npt.NDArray[np.int64]
    total_errors: int
    counted_link_minutes: int = 0

    @property
    def link_days(self) -> float:
        """Links × minutes / 1,440."""
        return self.n_links * self.n_minutes / 1440.0

    @property
    def total_alarms(self) -> int:
        """Alarm bins over every link."""
        return int(self.alarm_count.sum())

    @property
    def links_alarmed(self) -> int:
        """Links with at least one alarm."""
        return int((self.first_alarm_min >= 0).sum())


def _check_int(name: str, value: int, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo} (got {value!r})")
    return int(value)


def iter_counts(
    profile: RateProfile,
    n_links: int,
    n_minutes: int,
    *,
    seed: int = 0,
    max_chunk_elements: int = DEFAULT_MAX_CHUNK_ELEMENTS,
    link_block: int = DEFAULT_LINK_BLOCK,
    dispersion: float = 1.0,
    scale: npt.NDArray[np.float64] | None = None,
    unknown_min: Sequence[int] = (),
) -> Iterator[CountChunk]:
    """Stream counts for ``n_links`` × ``n_minutes`` under ``profile``: Poisson, or with
    ``dispersion`` φ > 1 negative binomial (gamma-Poisson) with variance/mean φ in every bin.
    ``scale`` (n_links,) multiplies each link's profile (links with their own baselines);
    minutes in ``unknown_min`` are unknown bins (NaN: a counter reset; counts then float64).

    Yields link block after link block (``link_block`` links each, the last one shorter);
    within a block, minute chunks in time order, each holding at most
    ``max(max_chunk_elements, links in block)`` counts.

    Raises:
        ValueError: counts or sizes below 1.
    """
    n_links = _check_int("n_links", n_links, 1)
    n_minutes = _check_int("n_minutes", n_minutes, 1)
    max_chunk_elements = _check_int("max_chunk_elements", max_chunk_elements, 1)
    link_block = _check_int("link_block", link_block, 1)
    if not (math.isfinite(dispersion) and dispersion >= 1.0):
        raise ValueError(f"dispersion must be >= 1 (got {dispersion})")
    if scale is not None and (np.shape(scale) != (n_links,) or not (
            np.isfinite(scale) & (np.asarray(scale) > 0)).all()):
        raise ValueError(f"scale must have shape ({n_links},) with finite values > 0")
    unknown = np.asarray(sorted(set(unknown_min)), dtype=np.int64)
    for b, l0 in enumerate(range(0, n_links, link_block)):
        l1 = min(l0 + link_block, n_links)
        width = l1 - l0
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), b])))
        step = max(1, max_chunk_elements // width)
        for m0 in range(0, n_minutes, step):
            m = min(step, n_minutes - m0)
            lam = profile.bin_means(m0, m)[:, None]
            if scale is not None:
                lam = lam * scale[None, l0:l1]
            if dispersion > 1.0:  # gamma mixing: mean lam, variance/mean dispersion
                shape = lam / (dispersion - 1.0)
                lam = rng.gamma(np.maximum(shape, 1e-12), dispersion - 1.0,
                                size=(m, width))
            counts = rng.poisson(lam, size=(m, width))  # time-major: C-order rows are minutes
            sel = unknown[(unknown >= m0) & (unknown < m0 + m)] - m0
            if sel.size:
                fc = counts.astype(np.float64)
                fc[sel] = np.nan
                yield CountChunk(l0, l1, m0, fc.T)
            else:
                yield CountChunk(l0, l1, m0, counts.T)


def run(
    profile: RateProfile,
    n_links: int,
    n_minutes: int,
    detector_factory: DetectorFactory,
    *,
    seed: int = 0,
    max_chunk_elements: int = DEFAULT_MAX_CHUNK_ELEMENTS,
    link_block: int = DEFAULT_LINK_BLOCK,
    dispersion: float = 1.0,
    scale: npt.NDArray[np.float64] | None = None,
    unknown_min: Sequence[int] = (),
    count_from_min: int = 0,
) -> HarnessResult:
    """Feed `iter_counts` chunks to one detector per link block and tally its alarms
    (``alarm_count`` counts alarms from minute ``count_from_min`` on: after a warm-up).

    Raises:
        ValueError: bad sizes (as `iter_counts`), or a detector returning an array of the
            wrong shape.
    """
    first = np.full(_check_int("n_links", n_links, 1), -1, dtype=np.int64)
    count = np.zeros(n_links, dtype=np.int64)
    total_errors = 0
    counted = 0
    detector: ChunkDetector | None = None
    block_start = -1
    for ch in iter_counts(profile, n_links, n_minutes, seed=seed,
                          max_chunk_elements=max_chunk_elements, link_block=link_block,
                          dispersion=dispersion, scale=scale, unknown_min=unknown_min):
        if ch.link_start != block_start:
            detector = detector_factory(ch.link_stop - ch.link_start)
            block_start = ch.link_start
        assert detector is not None
        total_errors += int(np.nansum(ch.counts))
        tail = ch.counts[:, max(0, count_from_min - ch.minute_start):]
        counted += int(tail.size if tail.dtype.kind in "ui" else np.isfinite(tail).sum())
        alarms = detector(ch.counts, ch.minute_start)
        if alarms is None:
            continue
        alarms = np.asarray(alarms)
        if alarms.shape != ch.counts.shape:
            raise ValueError(
                f"detector returned shape {alarms.shape}, expected {ch.counts.shape}"
            )
        hit = alarms.any(axis=1)
        if not hit.any():
            continue
        sl = slice(ch.link_start, ch.link_stop)
        if ch.minute_start >= count_from_min:
            count[sl] += alarms.sum(axis=1)
        else:
            count[sl] += alarms[:, max(0, count_from_min - ch.minute_start):].sum(axis=1)
        where = np.flatnonzero(hit & (first[sl] < 0))
        first[ch.link_start + where] = ch.minute_start + alarms[where].argmax(axis=1)
    return HarnessResult(n_links, int(n_minutes), first, count, total_errors, counted)


def detection_delays_min(
    first_alarm_min: npt.NDArray[np.int64], onset_min: float
) -> npt.NDArray[np.float64]:
    """Delay from a change at ``onset_min`` to each link's first alarm (end of its bin), min;
    NaN where a link never alarmed or alarmed before the onset (a false alarm)."""
    a = np.asarray(first_alarm_min)
    d = (a + 1.0) - onset_min
    return np.where((a >= 0) & (a >= onset_min), d, np.nan)


def cusum_reference_value(lambda0_per_min: float, lambda1_per_min: float) -> float:
    """Poisson CUSUM reference value k = (λ1 − λ0) / ln(λ1/λ0) (REFERENCE §3.3: 1.08/min for
    0.5 → 2/min). Raises ValueError unless 0 < λ0 < λ1."""
    if not (0.0 < lambda0_per_min < lambda1_per_min) or not math.isfinite(lambda1_per_min):
        raise ValueError(f"need 0 < lambda0 < lambda1 (got {lambda0_per_min}, {lambda1_per_min})")
    return (lambda1_per_min - lambda0_per_min) / math.log(lambda1_per_min / lambda0_per_min)


class PoissonCusum:
    """Reference upper Poisson CUSUM across links (Page 1954; REFERENCE §3.3), a `ChunkDetector`.

    S_t = max(0, S_{t−1} + x_t − k); alarm when S_t > h, then S restarts at 0 when
    ``reset_on_alarm`` (counting every alarm for ARL0), else keeps alarming. Reference only: the
    production detector is racky's.

    Args:
        n_links: links in the block (state shape (n_links,)).
        lambda0_per_min / lambda1_per_min: in-control and out-of-control rates; k from
            `cusum_reference_value`.
        h: decision interval (§3.3: 8 → ARL0 ≈ 300 days; 12 → ≈ 190 years).
    """

    def __init__(
        self, n_links: int, lambda0_per_min: float = LAMBDA0_PER_MIN,
        lambda1_per_min: float = 2.0, h: float = 8.0, *, reset_on_alarm: bool = True,
    ) -> None:
        if not (math.isfinite(h) and h > 0.0):
            raise ValueError(f"h must be > 0 (got {h})")
        self.k = cusum_reference_value(lambda0_per_min, lambda1_per_min)
        self.h = float(h)
        self.reset_on_alarm = reset_on_alarm
        self.s = np.zeros(_check_int("n_links", n_links, 1))

    def __call__(
        self, counts: npt.NDArray[np.int64] | npt.NDArray[np.float64], minute_start: int, /
    ) -> npt.NDArray[np.bool_]:
        """Advance over ``counts`` (links, minutes); returns alarms of the same shape."""
        if counts.ndim != 2 or counts.shape[0] != self.s.shape[0]:
            raise ValueError(f"counts must have shape ({self.s.shape[0]}, minutes)")
        alarms = np.zeros(counts.shape, dtype=bool)
        s, k, h = self.s, self.k, self.h
        for j in range(counts.shape[1]):
            s += counts[:, j]
            s -= k
            np.maximum(s, 0.0, out=s)
            a = s > h
            if a.any():
                alarms[:, j] = a
                if self.reset_on_alarm:
                    s[a] = 0.0
        return alarms


def cusum_factory(
    lambda0_per_min: float = LAMBDA0_PER_MIN, lambda1_per_min: float = 2.0, h: float = 8.0,
    *, reset_on_alarm: bool = True,
) -> DetectorFactory:
    """A `DetectorFactory` building `PoissonCusum` blocks with these settings."""
    cusum_reference_value(lambda0_per_min, lambda1_per_min)  # fail early on bad rates

    def make(n_links: int) -> ChunkDetector:
        return PoissonCusum(n_links, lambda0_per_min, lambda1_per_min, h,
                            reset_on_alarm=reset_on_alarm)

    return make


def quantiles(values: Sequence[float] | npt.NDArray[np.float64],
              qs: Sequence[float] = (0.5, 0.9)) -> tuple[float, ...]:
    """Quantiles of the finite ``values`` (NaN when none): median / p90 by default."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return tuple(math.nan for _ in qs)
    return tuple(float(x) for x in np.quantile(v, qs))
