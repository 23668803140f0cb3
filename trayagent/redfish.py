"""The BMC adapter: DMTF's Redfish client library (``redfish``, python-redfish-library; this
module is its only importer) reading a compute tray's chassis: input power
(``EnvironmentMetrics.PowerWatts``), coolant outlet temperature (the highest
``ReturnTemperatureCelsius`` of the chassis' ``ThermalSubsystem/CoolantConnectors``) and leak
detection (the chassis' ``LeakDetectors``, else ``ThermalSubsystem/LeakDetection/
LeakDetectors``; `trayagent.core.bmc.classify_leak`). Every resource is found by following the
links from ``/redfish/v1/Chassis/<chassis>``, never by a guessed path.

One session per BMC (``X-Auth-Token``), opened at the first read and reused, also across failed
reads (a BMC counts sessions against a small limit: a new login per timeout would leak them);
a 401 (the BMC ended it) logs in again once.
Calls are blocking with ``timeout_s`` per request and no retries: the agent reads each BMC in
its own task, so a slow BMC never stalls the publish loop. Calls on one BMC are serialised
(one session, one client: a cap set waits for a read under way).

**Capping at the BMC** (`BmcSource.hold_power_limit`): the chassis' power ``Control`` (Redfish
``Control`` schema, found through the chassis' ``Controls`` link: the member with
``ControlType`` Power and the configured ``Id``, else the one whose ``PhysicalContext`` is
Chassis). The ``SetPoint`` is clamped into the control's range (``SettingRangeMin/Max``, else
``AllowableMin/Max``), written with ``PATCH`` and ``If-Match: <ETag>`` of the read it is based
on; a ``412 Precondition Failed`` (someone else wrote it) re-reads and retries, at most
``attempts`` PATCHes; success is only what a GET after the write reads back.

**Events**: the agent polls; it never opens the BMC's event stream (Redfish SSE,
``EventService.ServerSentEventUri``). A BMC's stream drops on BMC resets and network blips and
a missed event is not replayed on every BMC (``Last-Event-ID`` is optional), so the leak and
power figures would still need polling to be trusted; a poll every ``control.tick_s`` with
``bmc.max_age_s`` staleness is the one path, and a stream that drops cannot affect it.
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any

import redfish

from trayagent.core.bmc import (
    BmcReading,
    ControlResult,
    clamp_setpoint,
    classify_leak,
    control_range,
    plausible,
)

__all__ = ["BmcSource"]


class _Gone(Exception):
    """The BMC answered with something other than the resource."""


def _set_point(ctl: dict[str, Any]) -> float | None:
    """A Control's ``SetPoint`` when it is a number inside the control's own range (a value
    outside it is not plausible: unknown); W."""
    lo, hi = control_range(ctl)
    v, _ = plausible(ctl.get("SetPoint"), 0.0 if lo is None else lo,
                     math.inf if hi is None else hi)
    return v



def _why(url: str, err: BaseException) -> str:
    """One line for a failed BMC request (≤ 300 characters): the exception and, when it is
    a wrapper (the library's ``RetriesExhaustedError`` has no message), the root cause it was
    raised from, e.g. ``ConnectionRefusedError: [Errno 111] Connection refused``."""
    head = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    root, seen = err, 0
    while (nxt := root.__cause__ or root.__context__) is not None and seen < 10:
        root, seen = nxt, seen + 1
    if root is not err:
        head += f" <- {type(root).__name__}: {root}"
    return f"BMC {url}: {head}"[:300]

class BmcSource:
    """One tray's BMC (module docstring).

    Args:
        url: ``https://<bmc>`` (``http://`` in tests).
        chassis: the tray's chassis id (``/redfish/v1/Chassis/<chassis>``).
        username, password: the account (the password comes from the environment).
        timeout_s: per request, s.
        power_window_w, outlet_window_c: plausibility windows (min, max); a reading outside
            is unknown with the reason.
        power_control: the ``Id`` of the chassis' power Control capped through (None: the
            one with ``PhysicalContext`` Chassis).
    """

    def __init__(self, url: str, chassis: str, username: str, password: str, timeout_s: float,
                 *, power_window_w: tuple[float, float] = (0.0, 20000.0),
                 outlet_window_c: tuple[float, float] = (-10.0, 100.0),
                 power_control: str | None = None) -> None:
        self.url, self.chassis = url, chassis
        self._user, self._password = username, password
        self.timeout_s = timeout_s
        self.power_window_w, self.outlet_window_c = power_window_w, outlet_window_c
        self._client: Any = None
        self._closed = False
        self.logins = 0
        self.power_control = power_control
        self._control_uri: str | None = None
        self._lock = threading.Lock()

    def _connect(self) -> Any:
        if self._closed:  # a read still under way when the agent stopped: no new session
            raise RuntimeError("closed")
        if self._client is None:
            c = redfish.redfish_client(base_url=self.url, username=self._user,
                                       password=self._password, timeout=self.timeout_s,
                                       max_retry=1)
            c.login(auth="session")
            self.logins += 1
            self._client = c
        return self._client

    def _request(self, method: str, path: str, **kw: Any) -> Any:
        r = getattr(self._connect(), method)(path, **kw)
        if r.status == 401:  # the BMC ended the session: one new login
            self._client = None
            r = getattr(self._connect(), method)(path, **kw)
        return r

    def _get_tagged(self, path: str) -> tuple[dict[str, Any], str | None]:
        r = self._request("get", path)
        if r.status != 200 or not isinstance(r.dict, dict):
            raise _Gone(f"GET {path}: HTTP {r.status}")
        etag = r.getheader("ETag")
        if etag is None and isinstance(r.dict.get("@odata.etag"), str):
            etag = r.dict["@odata.etag"]
        return dict(r.dict), etag

    def _get(self, path: str) -> dict[str, Any]:
        return self._get_tagged(path)[0]

    def _link(self, res: dict[str, Any], key: str) -> str | None:
        v = res.get(key)
        return v.get("@odata.id") if isinstance(v, dict) else None

    def _members(self, path: str) -> list[dict[str, Any]]:
        coll = self._get(path)
        out = []
        for m in coll.get("Members", []):
            uri = m.get("@odata.id") if isinstance(m, dict) else None
            if isinstance(uri, str):
                out.append(self._get(uri))
        return out

    def read(self, mono: float) -> BmcReading:
        """Read the tray's figures (blocking); never raises: an unreachable BMC gives every
        figure unknown with the reason."""
        with self._lock:
            return self._read(mono)

    def _read(self, mono: float) -> BmcReading:
        r = BmcReading(mono=mono)
        try:
            ch = self._get(f"/redfish/v1/Chassis/{self.chassis}")
            env = self._link(ch, "EnvironmentMetrics")
            if env is None:
                r.errors["power_w"] = "chassis has no EnvironmentMetrics"
            else:
                pw = self._get(env).get("PowerWatts")
                r.power_w, why = plausible(pw.get("Reading") if isinstance(pw, dict) else None,
                                           *self.power_window_w)
                if why:
                    r.errors["power_w"] = f"PowerWatts.Reading {why}"
            thermal = self._link(ch, "ThermalSubsystem")
            ts = self._get(thermal) if thermal is not None else {}
            conns = self._link(ts, "CoolantConnectors")
            temps: list[float] = []
            for c in self._members(conns) if conns is not None else []:
                rt = c.get("ReturnTemperatureCelsius")
                v, why = plausible(rt.get("Reading") if isinstance(rt, dict) else None,
                                   *self.outlet_window_c)
                if v is None:
                    r.errors["coolant_out_temp_c"] = f"{c.get('Id')}: {why}"
                    temps = []
                    break
                temps.append(v)
            if temps:
                r.coolant_out_temp_c = max(temps)
            elif "coolant_out_temp_c" not in r.errors:
                r.errors["coolant_out_temp_c"] = "no coolant connector with a return temperature"
            leak_uri = self._link(ch, "LeakDetectors")
            if leak_uri is None:
                ld = self._link(ts, "LeakDetection")
                leak_uri = self._link(self._get(ld), "LeakDetectors") if ld else None
            r.leak = classify_leak(self._members(leak_uri) if leak_uri else [])
        except Exception as err:  # the library raises its own, requests' and socket errors
            # the session is kept (a BMC counts sessions against a small limit: dropping it
            # on a timeout would leak one per failure); a 401 logs in again
            why = _why(self.url, err)
            for k in ("power_w", "coolant_out_temp_c", "leak"):
                r.errors.setdefault(k, why)
            r.power_w = r.coolant_out_temp_c = None
            r.leak = None
        return r

    def _find_control(self) -> str:
        if self._control_uri is not None:
            return self._control_uri
        ch = self._get(f"/redfish/v1/Chassis/{self.chassis}")
        coll = self._link(ch, "Controls")
        if coll is None:
            raise _Gone(f"chassis {self.chassis} has no Controls")
        for m in self._get(coll).get("Members", []):
            uri = m.get("@odata.id") if isinstance(m, dict) else None
            if not isinstance(uri, str):
                continue
            c = self._get(uri)
            if c.get("ControlType") != "Power":
                continue
            if (c.get("Id") == self.power_control if self.power_control is not None
                    else c.get("PhysicalContext") == "Chassis"):
                self._control_uri = uri
                return uri
        which = (f"Id {self.power_control!r}" if self.power_control is not None
                 else "PhysicalContext Chassis")
        raise _Gone(f"chassis {self.chassis}: no power Control with {which} in {coll}")

    def read_power_control(self) -> tuple[str | None, dict[str, float | None], str | None]:
        """The power Control's URI, ``{"set_point_w", "min_w", "max_w"}`` (the settable range,
        `control_range`) and None; or (None, {}, why). Blocking; never raises; writes nothing.
        """
        with self._lock:
            try:
                uri = self._find_control()
                ctl = self._get(uri)
            except Exception as e:  # the library's, requests' and socket errors
                return None, {}, _why(self.url, e)
        lo, hi = control_range(ctl)
        return uri, {"set_point_w": _set_point(ctl), "min_w": lo, "max_w": hi}, None

    def hold_power_limit(self, wanted_w: float | None, *, tolerance_w: float, attempts: int,
                         mono: float, dry_run: bool = False) -> ControlResult:
        """Hold the chassis' power Control at ``wanted_w`` W (None: released, the control's
        maximum), clamped into its range (module docstring). Blocking; never raises: what
        failed is the result's ``error``. Nothing is written when the read-back already
        matches, or with ``dry_run`` (then ``error`` says what would be set).

        Args:
            tolerance_w: a read-back within this of the target is enforced, W.
            attempts: most PATCHes (>= 1): a 412 re-reads the control and retries.
        """
        with self._lock:
            sent = 0
            target: float | None = None
            clamped: str | None = None
            enforced: float | None = None
            try:
                uri = self._find_control()
                while True:
                    ctl, etag = self._get_tagged(uri)
                    units = ctl.get("SetPointUnits", "W")
                    if units != "W":
                        err = f"{uri}: SetPointUnits {units!r}, not W"
                        break
                    enforced = _set_point(ctl)
                    target, clamped = clamp_setpoint(wanted_w, *control_range(ctl))
                    if target is None:
                        err = clamped or "no target"
                        break
                    if enforced is not None and abs(enforced - target) <= tolerance_w:
                        return ControlResult(wanted_w, target, clamped, enforced, True, sent,
                                             None, mono)
                    if dry_run:
                        err = f"dry run: would set SetPoint {target:g} W"
                        break
                    if sent >= attempts:
                        err = f"not confirmed after {sent} PATCH(es) (412: written by another)"
                        break
                    sent += 1
                    hdr = {} if etag is None else {"If-Match": etag}
                    r = self._request("patch", uri, body={"SetPoint": target}, headers=hdr)
                    if r.status == 412:
                        continue  # changed since our read: read again, retry
                    if r.status not in (200, 202, 204):
                        err = f"PATCH {uri}: HTTP {r.status}: {str(r.text)[:200]}"
                        ctl, _ = self._get_tagged(uri)
                        enforced = _set_point(ctl)
                        break
                    ctl, _ = self._get_tagged(uri)  # the read-back: the only proof
                    enforced = _set_point(ctl)
                    if enforced is not None and abs(enforced - target) <= tolerance_w:
                        return ControlResult(wanted_w, target, clamped, enforced, True, sent,
                                             None, mono)
                    err = (f"read back SetPoint {enforced} W after setting {target:g} W")
                    break
            except Exception as e:  # the library's, requests' and socket errors
                err = _why(self.url, e)
                self._control_uri = None if isinstance(e, _Gone) else self._control_uri
            return ControlResult(wanted_w, target, clamped, enforced, False, sent, err, mono)

    def close(self) -> None:
        """End the session (errors ignored: stopping); no read opens a new one after."""
        self._closed = True  # not under the lock: a read stuck on a slow BMC must not hold it
        c, self._client = self._client, None
        if c is not None:
            with contextlib.suppress(Exception):  # best effort at stop
                c.logout()
