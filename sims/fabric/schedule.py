"""Flap-schedule arithmetic of `sims.fabric.model.LinkFabric` (vectorised over ports): events
of a periodic DOWN→UP schedule before an instant, and the time spent down."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: Transition instants within this many seconds of a poll count as "at" the poll (float noise).
_T_EPS_S = 1e-9


def _n_before(
    t: float, first: npt.NDArray[np.float64], per: npt.NDArray[np.float64],
    count: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """Events at ``first + i·per`` (i < count) strictly before ``t`` (minus `_T_EPS_S`)."""
    k = np.ceil((t - first - _T_EPS_S) / per)
    return np.clip(k, 0.0, count)


def _down_time(
    t: float, s: npt.NDArray[np.float64], d: npt.NDArray[np.float64],
    per: npt.NDArray[np.float64], count: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """Time spent down in ``[s, t)`` by a schedule of ``count`` cycles (down ``d``, period
    ``per``)."""
    x = np.maximum(t - s, 0.0)
    k = np.floor(x / per)
    full = np.minimum(k, count)
    part = np.where(k < count, np.minimum(x - k * per, d), 0.0)
    return full * d + part
