"""The NVML adapter: the only importer of ``pynvml`` (nvidia-ml-py), NVIDIA's ctypes binding
of ``libnvidia-ml.so.1`` (loaded by that name through the dynamic loader: ``ldconfig``'s cache,
``LD_LIBRARY_PATH``).

Every call is blocking (the driver can take tens of ms, a GPU falling off the bus longer): the
agent calls this module from a worker thread, never from the event loop; a lock serialises the
calls. Each figure is read on its own: one that fails is None with the reason in
`GpuReading.errors` (``NVML_ERROR_NOT_SUPPORTED`` on a GPU without it, ``NO_PERMISSION``), and
``GPU_IS_LOST`` marks the GPU lost. Units: NVML gives mW, mJ, °C, percent; the readings are W,
mJ, °C, 0..1.

Power: ``nvmlDeviceGetPowerUsage`` is, on current data-centre GPUs (Ampere and later), the
1-second average (``power_kind = "average"``); the energy counter
(``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded, 64-bit) is reported
beside it. Clock-event reasons are decoded bit by bit (`trayagent.core.throttle`); bits this
agent does not name are kept in ``unknown_reason_bits`` (the caller logs them once).

Health (`NvmlSource.read_health`, `trayagent.core.health`): NVLink state and data-link error
counters per link (links probed up to ``NVML_NVLINK_MAX_LINKS``; a link NVML answers
``NOT_SUPPORTED`` or ``INVALID_ARGUMENT`` for does not exist), ECC corrected / uncorrected
totals (volatile and aggregate; ``NOT_SUPPORTED`` where ECC is off). Xid events
(`NvmlSource.xid_watch`, `XidWatch`): an NVML event set registered for
``nvmlEventTypeXidCriticalError`` on the devices that support it, waited on with a timeout.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pynvml

from trayagent.core.caps import DeviceLimits
from trayagent.core.health import NVLINK_COUNTERS, GpuHealth, NvLink, XidEvent
from trayagent.core.payload import GpuReading
from trayagent.core.throttle import decode_clock_events
from trayagent.sources import SourceError

__all__ = ["NvmlError", "NvmlSource", "XidWatch"]

_NO_SUCH = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)


class NvmlError(SourceError):
    """NVML could not be used at all (library not found, init failed), or a set failed; the
    message has NVML's error text."""


def _why(err: Exception) -> str:
    return str(err) or type(err).__name__


def _lost(err: Exception) -> bool:
    return getattr(err, "value", None) == pynvml.NVML_ERROR_GPU_IS_LOST


class NvmlSource:
    """The GPUs of this host through NVML (module docstring).

    Use: `open` once (returns the device count), `read` per GPU per interval, `set_limit` to
    apply a power limit, `close` at the end. Thread-safe (one lock).
    """

    cap_enforceable = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: dict[int, Any] = {}
        self._open = False

    def open(self) -> int:
        """Initialise NVML; the number of GPUs it sees.

        Raises:
            NvmlError: library not found, driver not loaded, init failed.
        """
        with self._lock:
            try:
                pynvml.nvmlInit()
                self._open = True
                n = int(pynvml.nvmlDeviceGetCount())
            except pynvml.NVMLError as err:
                raise NvmlError(f"NVML: {_why(err)}") from None
            return n

    def close(self) -> None:
        """Shut NVML down (errors ignored: the process is stopping)."""
        with self._lock:
            if self._open:
                self._open = False
                self._handles.clear()
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlShutdown()

    def refresh(self) -> None:
        """Nothing to fetch: NVML is read per GPU."""

    def _handle(self, index: int) -> Any:
        h = self._handles.get(index)
        if h is None:
            h = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._handles[index] = h
        return h

    def read(self, index: int, gpu: int) -> GpuReading:
        """Read NVML device ``index`` as rack-wide GPU ``gpu``; never raises for one figure
        (see the module docstring)."""
        r = GpuReading(gpu=gpu)
        with self._lock:
            try:
                h = self._handle(index)
            except pynvml.NVMLError as err:
                r.lost = _lost(err)
                r.errors["device"] = _why(err)
                for f in ("power_w", "limit_w"):
                    r.errors[f] = _why(err)
                return r

            def get(name: str, fn: Any, *args: Any) -> Any:
                try:
                    return fn(h, *args)
                except pynvml.NVMLError as err:
                    r.lost = r.lost or _lost(err)
                    r.errors[name] = _why(err)
                    return None

            mw = get("power_w", pynvml.nvmlDeviceGetPowerUsage)
            r.power_w = None if mw is None else mw / 1000.0
            r.power_kind = "average"
            r.energy_mj = get("energy_mj", pynvml.nvmlDeviceGetTotalEnergyConsumption)
            t = get("temp_c", pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU)
            r.temp_c = None if t is None else float(t)
            mask = get("reasons", pynvml.nvmlDeviceGetCurrentClocksEventReasons)
            if mask is not None:
                d = decode_clock_events(int(mask))
                r.reasons, r.unknown_reason_bits = d.names, d.unknown_bits
            u = get("utilization", pynvml.nvmlDeviceGetUtilizationRates)
            r.utilization = None if u is None else u.gpu / 100.0
            lim = get("limit_w", pynvml.nvmlDeviceGetEnforcedPowerLimit)
            r.limit_w = None if lim is None else lim / 1000.0
            mm = get("limits", pynvml.nvmlDeviceGetPowerManagementLimitConstraints)
            dflt = get("default_w", pynvml.nvmlDeviceGetPowerManagementDefaultLimit)
            r.limits = DeviceLimits(None if mm is None else mm[0] / 1000.0,
                                    None if mm is None else mm[1] / 1000.0,
                                    None if dflt is None else dflt / 1000.0)
            for attr, etype in (("ecc_corrected_volatile",
                                 pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                                ("ecc_uncorrected_volatile",
                                 pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
                n = get(attr, pynvml.nvmlDeviceGetTotalEccErrors, etype, pynvml.NVML_VOLATILE_ECC)
                setattr(r, attr, None if n is None else int(n))
        return r

    def set_limit(self, index: int, watts: float) -> None:
        """Set device ``index``'s power management limit to ``watts`` (rounded to the mW;
        needs root). Only the read-back proves it took.

        Raises:
            NvmlError: NVML refused (``INVALID_ARGUMENT`` outside the device's limits,
                ``NO_PERMISSION``, ``NOT_SUPPORTED``, ``GPU_IS_LOST``).
        """
        with self._lock:
            try:
                pynvml.nvmlDeviceSetPowerManagementLimit(self._handle(index),
                                                         round(watts * 1000.0))
            except pynvml.NVMLError as err:
                raise NvmlError(f"NVML set power limit of device {index} to {watts:g} W: "
                                f"{_why(err)}") from None

    def read_health(self, index: int) -> GpuHealth:
        """Device ``index``'s NVLink and ECC figures (module docstring); never raises for one
        figure (None with the reason)."""
        out = GpuHealth()
        with self._lock:
            try:
                h = self._handle(index)
            except pynvml.NVMLError as err:
                out.errors["device"] = _why(err)
                return out
            for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                try:
                    active = pynvml.nvmlDeviceGetNvLinkState(h, link)
                except pynvml.NVMLError as err:
                    if getattr(err, "value", None) in _NO_SUCH:
                        continue  # no such link on this GPU
                    out.errors[f"nvlink{link}"] = _why(err)
                    continue
                nl = NvLink(link, bool(active))
                for i, name in enumerate(NVLINK_COUNTERS):
                    try:
                        nl.counters[name] = int(
                            pynvml.nvmlDeviceGetNvLinkErrorCounter(h, link, i))
                    except pynvml.NVMLError as err:
                        nl.counters[name] = None
                        nl.errors[name] = _why(err)
                out.links.append(nl)
            for attr, etype, ctype in (
                    ("ecc_corrected_volatile", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                     pynvml.NVML_VOLATILE_ECC),
                    ("ecc_uncorrected_volatile", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                     pynvml.NVML_VOLATILE_ECC),
                    ("ecc_corrected_aggregate", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                     pynvml.NVML_AGGREGATE_ECC),
                    ("ecc_uncorrected_aggregate", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                     pynvml.NVML_AGGREGATE_ECC)):
                try:
                    setattr(out, attr, int(pynvml.nvmlDeviceGetTotalEccErrors(h, etype, ctype)))
                except pynvml.NVMLError as err:
                    out.errors[attr] = _why(err)
        return out

    def xid_watch(self, indices: list[int]) -> XidWatch:
        """An Xid event watch on the devices of ``indices`` that offer Xid events (the others
        in `XidWatch.unsupported` with the reason).

        Raises:
            NvmlError: no event set could be created.
        """
        with self._lock:
            try:
                es = pynvml.nvmlEventSetCreate()
            except pynvml.NVMLError as err:
                raise NvmlError(f"NVML event set: {_why(err)}") from None
            w = XidWatch(self, es)
            for i in indices:
                try:
                    h = self._handle(i)
                    if not pynvml.nvmlDeviceGetSupportedEventTypes(h) & \
                            pynvml.nvmlEventTypeXidCriticalError:
                        w.unsupported[i] = "the driver offers no Xid events for this device"
                        continue
                    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError,
                                                    es)
                    w.devices[self._address(h)] = i
                except pynvml.NVMLError as err:
                    w.unsupported[i] = _why(err)
            return w

    @staticmethod
    def _address(h: Any) -> int:
        """A device handle's identity (the C pointer): matches an event's ``device``."""
        import ctypes

        return int(ctypes.cast(h, ctypes.c_void_p).value or 0)


class XidWatch:
    """Xid events of some devices (`NvmlSource.xid_watch`): `wait` blocks up to its timeout
    (call it from a worker thread); `close` frees the event set. ``devices``: handle address ->
    device index; ``unsupported``: device index -> why it is not watched."""

    def __init__(self, src: NvmlSource, event_set: Any) -> None:
        self._src, self._set = src, event_set
        self.devices: dict[int, int] = {}
        self.unsupported: dict[int, str] = {}
        self._closed = False
        self._waiting = threading.Lock()  # close waits for a wait under way

    def wait(self, timeout_ms: int) -> list[XidEvent]:
        """The Xid events that arrive within ``timeout_ms`` (at most one per call; an empty
        list on the timeout). Not under the source's lock: a wait must not hold the reads up.

        Raises:
            NvmlError: the wait failed for another reason than the timeout.
        """
        try:
            with self._waiting:
                if self._closed:
                    return []
                data = pynvml.nvmlEventSetWait_v2(self._set, timeout_ms)
        except pynvml.NVMLError as err:
            if getattr(err, "value", None) == pynvml.NVML_ERROR_TIMEOUT:
                return []
            raise NvmlError(f"NVML event wait: {_why(err)}") from None
        if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
            return []
        dev = self.devices.get(NvmlSource._address(data.device), -1)
        return [XidEvent(dev, int(data.eventData))]

    def close(self) -> None:
        """Free the event set (errors ignored)."""
        with self._waiting:
            if not self._closed:
                self._closed = True
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlEventSetFree(self._set)
