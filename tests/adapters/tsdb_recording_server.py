"""A small in-process HTTP endpoint that records exact ``/api/v2/write`` and 1.x ``/write``
requests.

It sits beside the real VictoriaMetrics (which ignores org, bucket, precision and token, and
never answers 400 for a type conflict: TEST-SERVERS.md) to check what the client actually
sends and how the writer reacts to 204/400/401/413/429/500/503. It never replaces the real
server in a test that checks storage.

Usage::

    with RecordingTsdb() as rec:
        rec.script(Reply(400, body), Reply(204))  # next answers, then the default (204)
        ... point the writer at rec.url ...
        rec.wait_lines(100)
        rec.requests[0].query["precision"] == "ns"
"""

from __future__ import annotations

import gzip
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One scripted answer: status, body (JSON text for InfluxDB-style errors), headers."""

    status: int = 204
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass(frozen=True)
class RecordedRequest:
    """One request as received (before it is answered)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: str
    status: int
    t_mono: float

    @property
    def lines(self) -> list[str]:
        return [line for line in self.body.split("\n") if line]


class RecordingTsdb:
    """Records every request; answers scripted replies in order, then ``default``."""

    def __init__(self, default: Reply | None = None):
        self.default = default or Reply(204)
        self.requests: list[RecordedRequest] = []
        self._script: deque[Reply] = deque()
        self._cond = threading.Condition()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as urllib3 expects

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                owner._handle(self)

            def do_GET(self) -> None:
                owner._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> RecordingTsdb:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> RecordingTsdb:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def script(self, *replies: Reply) -> None:
        """Queue answers for the next requests (then ``default`` again)."""
        with self._cond:
            self._script.extend(replies)

    def lines(self) -> list[str]:
        """Every line of every write request, in arrival order (duplicates kept)."""
        with self._cond:
            return [line for r in self.requests for line in r.lines]

    def wait_requests(self, n: int, timeout_s: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self.requests) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def wait_lines(self, n: int, timeout_s: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while sum(len(r.lines) for r in self.requests) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        if h.headers.get("Content-Encoding") == "gzip":
            raw = gzip.decompress(raw)
        with self._cond:
            reply = self._script.popleft() if self._script else self.default
            if url.path not in ("/api/v2/write", "/write"):  # the v2 and the 1.x write API
                reply = Reply(404, '{"code":"not found","message":"path not found"}')
            self.requests.append(
                RecordedRequest(
                    method=h.command,
                    path=url.path,
                    query=dict(urllib.parse.parse_qsl(url.query)),
                    headers={k: v for k, v in h.headers.items()},
                    body=raw.decode(errors="replace"),
                    status=reply.status,
                    t_mono=time.monotonic(),
                )
            )
            self._cond.notify_all()
        if reply.delay_s:
            time.sleep(reply.delay_s)
        body = reply.body.encode()
        try:
            h.send_response(reply.status)
            for k, v in reply.headers.items():
                h.send_header(k, v)
            if body:
                h.send_header("Content-Type", "application/json; charset=utf-8")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            if body:
                h.wfile.write(body)
        except OSError:
            pass  # the client went away (killed, timed out)
