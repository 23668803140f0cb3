"""A small Redfish service for tests: DMTF's mockups (tests/data/redfish) served as they are,
plus what a real BMC does that a static mockup does not:

- **sessions** (``POST /redfish/v1/SessionService/Sessions`` with ``UserName`` / ``Password``:
  201, ``X-Auth-Token``, ``Location``; ``DELETE`` ends one) with a limit: beyond
  ``max_sessions`` open sessions a login is refused 503, as BMCs do; every resource but the
  service root needs a valid token (401 otherwise); ``logins`` counts them;
- **slow answers**: ``delay_s`` before every answer;
- **ETag / If-Match**: every GET answers the resource's ``ETag`` (a version bumped by each
  write); ``PATCH`` of a ``Control`` (``SetPoint`` only) needs ``If-Match`` (428 without, 412
  when it is not the current one), refuses a value outside ``AllowableMin/Max`` (400
  PropertyValueOutOfRange); ``conflicts`` = N makes the next N PATCHes find the control written
  by someone else (412); ``ignore_writes`` answers 204 and keeps the old value (a BMC that
  drops a set: only the read-back tells); ``patches`` counts PATCHes;
- the server chassis ``1U`` links ``LeakDetectors`` to the cooling unit's (``Chassis/CDU``),
  and ``overrides`` replaces JSON properties of a resource (a wet or faulted detector);
- ``Controls`` of chassis 1U serves only its ``PowerLimit`` (the one copied);
- **what a service serves** (checked with DMTF's redfish-service-validator,
  tests/unit/test_redfish_validator.py): the subset of the mockups copied, so links to
  resources not copied are left out of the answers (a navigation link, a collection member,
  a ``DataSourceUri``; counts follow); no ``@Redfish.Copyright`` (a mockup-only annotation:
  it stays in the files, DMTF's notice); two fixes to the mockup: ``EnvironmentMetrics``
  gets its mandatory ``Id``, the deprecated ``IndicatorLED`` of chassis 1U is left out; the
  session collection lists the open sessions, each served as a ``Session`` (the mockup's as
  the template);
- a **dropping event stream**: ``GET /redfish/v1/EventService/SSE`` (Redfish server-sent
  events) sends ``sse_events_per_connection`` events one per ``sse_period_s`` and then drops
  the connection; ``sse_connections`` counts the clients that opened it.
"""

from __future__ import annotations

import copy
import http.server
import json
import secrets
import threading
import time
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data" / "redfish"


def _load() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for mock in ("public-liquid-cooled-server", "public-cooling-unit"):
        for f in (DATA / mock).rglob("index.json"):
            rel = f.parent.relative_to(DATA / mock).as_posix()
            uri = "/redfish/v1" + ("" if rel == "." else "/" + rel)
            out[uri] = json.loads(f.read_text())
    out["/redfish/v1/Chassis/1U"]["LeakDetectors"] = {
        "@odata.id": "/redfish/v1/Chassis/CDU/LeakDetectors"}
    out["/redfish/v1/Chassis/1U/EnvironmentMetrics"].setdefault("Id", "EnvironmentMetrics")
    out["/redfish/v1/Chassis/1U"].pop("IndicatorLED", None)
    ctl = out.get("/redfish/v1/Chassis/1U/Controls")
    if ctl is not None:  # only PowerLimit was copied
        ctl["Members"] = [m for m in ctl["Members"] if m["@odata.id"] in out]
        ctl["Members@odata.count"] = len(ctl["Members"])
    return out


SESSIONS = "/redfish/v1/SessionService/Sessions"


def _is_link(x: Any) -> bool:
    return isinstance(x, dict) and set(x) == {"@odata.id"}


def _served(x: Any, served: Any) -> Any:
    """``x`` as served: links to resources not served and ``@Redfish.Copyright`` left out."""
    if isinstance(x, list):
        return [_served(i, served) for i in x if not (_is_link(i) and
                                                      i["@odata.id"] not in served)]
    if not isinstance(x, dict):
        return x
    out: dict[str, Any] = {}
    for k, v in x.items():
        if k == "@Redfish.Copyright" or (_is_link(v) and v["@odata.id"] not in served) or \
                (k == "DataSourceUri" and v not in served):
            continue
        out[k] = _served(v, served)
    for k in list(out):
        if k.endswith("@odata.count") and isinstance(out.get(k[:-len("@odata.count")]), list):
            out[k] = len(out[k[:-len("@odata.count")]])
    return out


class RedfishServer:
    """``url``: the base URL; ``user`` / ``password``: the one account; ``delay_s``,
    ``max_sessions``, ``overrides`` (URI -> properties laid over the mockup's), ``logins``."""

    def __init__(self, *, user: str = "admin", password: str = "secret",
                 max_sessions: int = 2) -> None:
        self.resources = _load()
        self.user, self.password = user, password
        self.max_sessions = max_sessions
        self.sessions: dict[str, str] = {}
        self.logins = 0
        self.delay_s = 0.0
        self.overrides: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, int] = {}
        self.conflicts = 0
        self.ignore_writes = False
        self.patches = 0
        self.sse_connections = 0
        self.sse_events_per_connection = 2
        self.sse_period_s = 0.1
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, status: int, body: Any = None,
                      headers: dict[str, str] | None = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _authorised(self) -> bool:
                return self.headers.get("X-Auth-Token", "") in outer.sessions

            def do_GET(self) -> None:
                time.sleep(outer.delay_s)
                path = self.path.rstrip("/") or "/"
                if path != "/redfish/v1" and not self._authorised():
                    self._send(401, {"error": {"code": "Base.1.0.NoValidSession"}})
                    return
                if path == "/redfish/v1/EventService/SSE":
                    self._sse()
                    return
                res = outer.resources.get(path) if path in outer else None
                if path == SESSIONS:
                    res = {**outer.resources[SESSIONS], "Members": [
                        {"@odata.id": f"{SESSIONS}/{sid}"} for sid in outer.sessions.values()]}
                elif path.startswith(SESSIONS + "/") and \
                        path[len(SESSIONS) + 1:] in outer.sessions.values():
                    sid = path[len(SESSIONS) + 1:]
                    res = {**outer.resources[f"{SESSIONS}/1234567890ABCDEF"], "Id": sid,
                           "UserName": outer.user, "@odata.id": path}
                if res is None:
                    self._send(404, {"error": {"code": "Base.1.0.ResourceMissingAtURI"}})
                    return
                with outer.lock:
                    body = copy.deepcopy(res)
                    body.update(outer.overrides.get(path, {}))
                    etag = outer.etag(path)
                    body = _served(body, outer)
                self._send(200, body, {"ETag": etag})

            def _sse(self) -> None:
                outer.sse_connections += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for i in range(outer.sse_events_per_connection):
                    ev = {"@odata.type": "#Event.v1_10_0.Event", "Id": str(i),
                          "Events": [{"EventType": "Other", "MessageId": "Base.1.0.Success"}]}
                    self.wfile.write(f"id: {i}\ndata: {json.dumps(ev)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(outer.sse_period_s)
                self.close_connection = True  # the drop: no end of stream, the socket closes

            def do_PATCH(self) -> None:
                time.sleep(outer.delay_s)
                n = int(self.headers.get("Content-Length", "0"))
                req = json.loads(self.rfile.read(n) or b"{}")
                path = self.path.rstrip("/")
                if not self._authorised():
                    self._send(401, {"error": {"code": "Base.1.0.NoValidSession"}})
                    return
                res = outer.resources.get(path)
                if res is None or not str(res.get("@odata.type", "")).startswith(
                        "#Control."):
                    self._send(405)
                    return
                with outer.lock:
                    outer.patches += 1
                    if outer.conflicts > 0:  # another client wrote it just before
                        outer.conflicts -= 1
                        outer.versions[path] = outer.versions.get(path, 0) + 1
                    match = self.headers.get("If-Match")
                    if match is None:
                        self._send(428, {"error": {"code": "Base.1.0.PreconditionRequired"}})
                        return
                    if match != outer.etag(path):
                        self._send(412, {"error": {"code": "Base.1.0.PreconditionFailed"}})
                        return
                    sp = req.get("SetPoint")
                    if set(req) != {"SetPoint"} or isinstance(sp, bool) or \
                            not isinstance(sp, int | float):
                        self._send(400, {"error": {"code": "Base.1.0.PropertyValueTypeError"}})
                        return
                    if not res["AllowableMin"] <= sp <= res["AllowableMax"]:
                        self._send(400, {"error": {
                            "code": "Base.1.0.PropertyValueOutOfRange"}})
                        return
                    if not outer.ignore_writes:
                        res["SetPoint"] = sp
                        outer.versions[path] = outer.versions.get(path, 0) + 1
                self._send(204)

            def do_POST(self) -> None:
                time.sleep(outer.delay_s)
                n = int(self.headers.get("Content-Length", "0"))
                req = json.loads(self.rfile.read(n) or b"{}")
                if self.path.rstrip("/") != "/redfish/v1/SessionService/Sessions":
                    self._send(405)
                    return
                if (req.get("UserName"), req.get("Password")) != (outer.user, outer.password):
                    self._send(401, {"error": {"code": "Base.1.0.InvalidCredentials"}})
                    return
                if len(outer.sessions) >= outer.max_sessions:
                    self._send(503, {"error": {"code": "Base.1.0.SessionLimitExceeded"}})
                    return
                token = secrets.token_hex(16)
                sid = secrets.token_hex(4)
                outer.sessions[token] = sid
                outer.logins += 1
                loc = f"/redfish/v1/SessionService/Sessions/{sid}"
                self._send(201, {"@odata.id": loc, "Id": sid, "UserName": outer.user},
                           {"X-Auth-Token": token, "Location": loc})

            def do_DELETE(self) -> None:
                token = self.headers.get("X-Auth-Token", "")
                sid = outer.sessions.get(token)
                if sid is None or not self.path.endswith(sid):
                    self._send(401)
                    return
                del outer.sessions[token]
                self._send(204)

            def log_message(self, *args: object) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that timed out and hung up: expected in the slow-BMC tests

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def __contains__(self, uri: object) -> bool:
        """A URI this service answers (the session template is not one)."""
        if not isinstance(uri, str) or uri == f"{SESSIONS}/1234567890ABCDEF":
            return False
        return uri in self.resources or uri in {f"{SESSIONS}/{s}"
                                                for s in self.sessions.values()}

    def etag(self, path: str) -> str:
        """The resource's current entity tag."""
        return f'"{self.versions.get(path, 0)}"'

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
