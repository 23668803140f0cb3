"""The NATS relay's server-side scanner (`harness.nats_cut`): ``connect_urls`` emptied in
every ``INFO``, everything else passed through byte for byte, whatever the chunking."""

from __future__ import annotations

import json

from harness.nats_cut import _ServerStream, strip_discovery

INFO = ('INFO {"server_id":"X","connect_urls":["127.0.0.1:4223","127.0.0.1:4224"],'
        '"max_payload":1048576}')
# a payload that looks like protocol (an INFO, CRLF) must be passed by its stated size
BODY = b'INFO {"connect_urls":["x:1"]}\r\nPING\r\n'
HBODY = b"NATS/1.0\r\nA: b\r\n\r\n" + BODY
STREAM = (INFO.encode() + b"\r\n+OK\r\nPING\r\n"
          + b"MSG a.b 1 _INBOX.x " + str(len(BODY)).encode() + b"\r\n" + BODY + b"\r\n"
          + b"HMSG a.b 2 17 " + str(len(HBODY)).encode() + b"\r\n" + HBODY + b"\r\n"
          + INFO.encode() + b"\r\nPONG\r\n")


def _expected() -> bytes:
    info = strip_discovery(INFO.encode())
    return STREAM.replace(INFO.encode() + b"\r\n", info + b"\r\n")


def test_info_loses_connect_urls_only() -> None:
    out = strip_discovery(INFO.encode())
    assert out.startswith(b"INFO ")
    d = json.loads(out[5:])
    assert d == {"server_id": "X", "connect_urls": [], "max_payload": 1048576}
    assert strip_discovery(b"INFO {not json") == b"INFO {not json"


def test_any_chunking_gives_the_same_stream() -> None:
    want = _expected()
    assert want.count(b'"connect_urls":[]') == 2
    assert BODY in want and HBODY in want  # payloads untouched
    for size in (1, 2, 3, 7, 16, 64, len(STREAM)):
        s = _ServerStream()
        out = b"".join(s.feed(STREAM[i:i + size]) for i in range(0, len(STREAM), size))
        assert out == want, size
        assert s.buf == b""
