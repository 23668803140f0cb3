"""Generic detectors, pure and vectorised with numpy (DESIGN §2 ``detect/``).

Every detector here keeps one state element per monitored thing (a port, a GPU, a counter of
a port) in numpy arrays and is advanced by one call per poll with the time passed in: no
Python loop over elements, no clock, no I/O, so a rack's 1,440 ports (or a row's 11,520) cost
a constant number of numpy calls per tick.

Modules:

- `rackplane.core.detect.threshold`: `VectorThreshold` (threshold with on/off delay and hysteresis,
  above or below).
- `rackplane.core.detect.counters`: `CounterDeltas` (deltas right across 32/64-bit wraps, resets by
  uptime or boot id, saturating counters as "rate unknown", never negative; FIELD-CASES BR-11).
- `rackplane.core.detect.flap`: `WindowCountRule` (N events within W, quiet Q to clear; BR-13,
  NVSentinel), `FlapScore` (penalty with exponential decay and a hold-down), `EventWindow`
  (DCGM-style "any rise within the window").
- `rackplane.core.detect.change`: `PoissonCusum`, `PoissonEwma` (sequential change tests on
  per-bin counts, REFERENCE §3.3), `BinAccumulator` (irregular deltas into fixed bins), and
  the static rules they are compared with: `WindowSum` (60-min window > 120) and `RateFor`
  (Prometheus-style ``rate(x[5m]) > thr for 5m``).
- `rackplane.core.detect.trend`: `RateOfRise` (least-squares slope over a short window) and
  `time_to_limit` (predicted time to reach a limit).
"""

from rackplane.core.detect.change import (
    BinAccumulator,
    PoissonCusum,
    PoissonEwma,
    RateFor,
    WindowSum,
    cusum_reference_value,
)
from rackplane.core.detect.counters import CounterDeltas, CounterStatus, CounterStep
from rackplane.core.detect.flap import EventWindow, FlapScore, WindowCountRule
from rackplane.core.detect.threshold import ThresholdDetector, VectorThreshold
from rackplane.core.detect.trend import RateOfRise, time_to_limit

__all__ = [
    "BinAccumulator",
    "CounterDeltas",
    "CounterStatus",
    "CounterStep",
    "EventWindow",
    "FlapScore",
    "PoissonCusum",
    "PoissonEwma",
    "RateFor",
    "RateOfRise",
    "ThresholdDetector",
    "VectorThreshold",
    "WindowCountRule",
    "WindowSum",
    "cusum_reference_value",
    "time_to_limit",
]
