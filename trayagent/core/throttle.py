"""NVML clock-event (throttle) reasons decoded bit by bit.

Source: NVML ``nvmlClocksEventReason*`` (nvml.h; also ``nvmlClocksThrottleReason*`` before
driver 535): 0x1 gpu_idle, 0x2 applications_clocks_setting, 0x4 sw_power_cap, 0x8 hw_slowdown,
0x10 sync_boost, 0x20 sw_thermal_slowdown, 0x40 hw_thermal_slowdown, 0x80
hw_power_brake_slowdown, 0x100 display_clock_setting (the contract's names,
`rackplane.core.tray_contract.CLOCK_EVENT_REASONS`). A bit NVML defines later is returned as
unknown (the caller logs it once), never an error.
"""

from __future__ import annotations

from typing import NamedTuple

from rackplane.core.tray_contract import CLOCK_EVENT_REASONS

__all__ = ["KNOWN_MASK", "Decoded", "decode_clock_events"]

KNOWN_MASK = (1 << len(CLOCK_EVENT_REASONS)) - 1
"""The bits this agent names (0x1 .. 0x100)."""

MASK_MAX = 2**64 - 1
"""NVML returns an unsigned long long."""


class Decoded(NamedTuple):
    """``names``: the known reasons set, in bit order; ``unknown_bits``: the set bits this
    agent does not name (0: none)."""

    names: list[str]
    unknown_bits: int


def decode_clock_events(mask: int) -> Decoded:
    """The reasons of an NVML clock-event mask (an unsigned 64-bit integer).

    Raises:
        ValueError: ``mask`` is not an integer in [0, 2**64).
    """
    if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask <= MASK_MAX:
        raise ValueError(f"clock-event mask {mask!r} is not an unsigned 64-bit integer")
    names = [n for i, n in enumerate(CLOCK_EVENT_REASONS) if mask >> i & 1]
    return Decoded(names, mask & ~KNOWN_MASK)
