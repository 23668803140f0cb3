"""The on-disk telemetry spool (rackplane.io.spool): cursor, rotation, bound, repair, versions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rackplane.errors import SpoolError
from rackplane.io.spool import (
    CURSOR_FILE,
    HEADER,
    HEADER_LEN,
    REPLAY_CURSOR_FILE,
    Spool,
    segment_name,
)
from rackplane.settings import SpoolSettings

SEG = 4096
MAX = 4 * SEG


def lines(a: int, b: int) -> list[str]:
    """Distinct line-protocol lines number a..b-1, ~60 bytes each."""
    return [f"m,rack=r1 v={i},pad=1234567890 {1_767_225_600_000_000_000 + i}" for i in range(a, b)]


def spool(d: Path, **kw: object) -> Spool:
    args: dict[str, object] = {"max_bytes": 64 * SEG, "segment_bytes": SEG}
    args.update(kw)
    return Spool(d, **args)  # type: ignore[arg-type]


def drain(sp: Spool, batch: int = 7) -> list[str]:
    out: list[str] = []
    while True:
        got, cur = sp.read(batch)
        if not got:
            sp.ack(cur)
            return out
        out.extend(got)
        sp.ack(cur)


def segments(d: Path) -> list[Path]:
    return sorted(d.glob("seg-*.lp"))


def test_append_read_ack_roundtrip_and_retry_rereads(tmp_path: Path) -> None:
    with spool(tmp_path) as sp:
        assert sp.append(lines(0, 10)) == 10
        got, cur = sp.read(4)
        assert got == lines(0, 4)
        again, cur2 = sp.read(4)  # no ack: a retry resends the same lines
        assert again == got and cur2 == cur
        sp.ack(cur)
        assert sp.stats.depth_lines == 6
        assert drain(sp) == lines(4, 10)
        st_ = sp.stats
        counts = (st_.depth_lines, st_.depth_bytes, st_.appended_lines, st_.acked_lines)
        assert counts == (0, 0, 10, 10)


def test_restart_resumes_exactly_where_acks_stopped(tmp_path: Path) -> None:
    with spool(tmp_path) as sp:
        sp.append(lines(0, 100))
        _, cur = sp.read(37)
        sp.ack(cur)
        sp.read(20)  # read but never acked: must come back after the restart
    with spool(tmp_path) as sp:
        assert sp.stats.depth_lines == 63
        assert drain(sp, 50) == lines(37, 100)


def test_segments_rotate_at_segment_bytes_and_acked_ones_are_deleted(tmp_path: Path) -> None:
    with spool(tmp_path) as sp:
        for i in range(0, 400, 10):
            sp.append(lines(i, i + 10))
        segs = segments(tmp_path)
        assert len(segs) >= 5
        assert all(p.stat().st_size <= SEG for p in segs)
        assert all(p.read_bytes().startswith(HEADER) for p in segs)
        assert sp.stats.segments == len(segs)
        # one batch that crosses several segment boundaries is split between whole lines
        sp.append(lines(400, 600))
        assert all(p.stat().st_size <= SEG for p in segments(tmp_path))
        assert drain(sp, 33) == lines(0, 600)
        assert len(segments(tmp_path)) == 1  # only the tail remains


def test_bound_drops_oldest_segments_and_counts_lost_lines(tmp_path: Path) -> None:
    with spool(tmp_path, max_bytes=MAX) as sp:
        for i in range(0, 2000, 5):
            sp.append(lines(i, i + 5))
        st_ = sp.stats
        assert st_.total_bytes <= MAX
        kept = drain(sp, 100)
        # the newest lines are kept, contiguous up to the last one; the rest is counted
        assert kept == lines(2000 - len(kept), 2000)
        assert st_.dropped_by_bound == 2000 - len(kept)
        assert st_.depth_lines == len(kept)


def test_bound_counts_only_unacked_lines_of_a_partly_acked_segment(tmp_path: Path) -> None:
    with spool(tmp_path, max_bytes=MAX) as sp:
        sp.append(lines(0, 30))
        _, cur = sp.read(10)
        sp.ack(cur)
        i = 30
        while sp.stats.dropped_by_bound == 0:
            sp.append(lines(i, i + 1))
            i += 1
        first_seg_lines = sum(1 for x in segments(tmp_path)[0].read_text().splitlines()[1:])
        assert first_seg_lines > 0
        kept = drain(sp, 1000)
        assert sp.stats.dropped_by_bound + len(kept) == i - 10  # acked lines are not "lost"
        assert kept == lines(i - len(kept), i)


def test_embedded_store_stays_bounded_while_rotating(tmp_path: Path) -> None:
    with spool(tmp_path, max_bytes=MAX) as sp:  # never drained: the embedded store
        for i in range(0, 5000, 50):
            sp.append(lines(i, i + 50))
            assert sp.stats.total_bytes <= MAX
        st_ = sp.stats
        assert st_.dropped_by_bound + st_.depth_lines == 5000
        assert 2 <= st_.segments <= MAX // SEG


def test_torn_last_line_is_cut_and_the_segment_repaired(tmp_path: Path) -> None:
    with spool(tmp_path) as sp:
        sp.append(lines(0, 3))
    tail = segments(tmp_path)[-1]
    torn = b"m,rack=r1 v=99,pad=12345"  # a crash in the middle of a write
    with tail.open("ab") as fh:
        fh.write(torn)
    with spool(tmp_path) as sp:
        assert sp.stats.repaired_bytes == len(torn)
        sp.append(lines(3, 5))
        assert drain(sp) == lines(0, 5)  # the new line is not glued to the torn one
    assert tail.read_bytes().endswith(b"\n")


def test_nul_tail_after_power_loss_is_cut(tmp_path: Path) -> None:
    with spool(tmp_path) as sp:
        sp.append(lines(0, 3))
    tail = segments(tmp_path)[-1]
    with tail.open("ab") as fh:
        fh.write(b"\x00" * 300)
    with spool(tmp_path) as sp:
        assert sp.stats.repaired_bytes == 300
        assert drain(sp) == lines(0, 3)


def test_segment_torn_at_creation_is_removed(tmp_path: Path) -> None:
    with spool(tmp_path) as sp:
        sp.append(lines(0, 3))
    (tmp_path / segment_name(2)).write_bytes(HEADER[:7])
    with spool(tmp_path) as sp:
        sp.append(lines(3, 4))
        assert drain(sp) == lines(0, 4)


def test_corrupt_record_is_skipped_and_counted(tmp_path: Path) -> None:
    with spool(tmp_path) as sp:
        sp.append(lines(0, 2))
    tail = segments(tmp_path)[-1]
    with tail.open("ab") as fh:
        fh.write(b"m v=\x00\x001 1\n")
        fh.write(b"\xff\xfe bad utf-8\n")
    with spool(tmp_path) as sp:
        sp.append(lines(2, 3))
        assert drain(sp) == lines(0, 3)
        assert sp.stats.corrupt_lines == 2
        assert sp.stats.depth_lines == 0


def test_version_header_mismatch_is_refused_clearly(tmp_path: Path) -> None:
    (tmp_path / segment_name(1)).write_bytes(b"# rackplane-spool v2\nm v=1 1\n")
    with pytest.raises(SpoolError, match=r"spool format v2; this rackplane reads v1"):
        spool(tmp_path)
    with pytest.raises(SpoolError, match=r"v2"):
        Spool(tmp_path, readonly=True).read(10)


def test_foreign_file_in_spool_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / segment_name(1)).write_bytes(b"m v=1 1\n")
    with pytest.raises(SpoolError, match="not a rackplane spool segment"):
        spool(tmp_path)


def test_cursor_of_another_version_is_refused(tmp_path: Path) -> None:
    with spool(tmp_path) as sp:
        sp.append(lines(0, 3))
        _, cur = sp.read(1)
        sp.ack(cur)
    rec = json.dumps({"format": "rackplane-spool-cursor", "version": 2, "seq": 9})
    (tmp_path / CURSOR_FILE).write_bytes(rec.encode().ljust(511) + b"\n")
    with pytest.raises(SpoolError, match="v2 cursor"):
        spool(tmp_path)


def test_torn_cursor_slot_falls_back_to_the_previous_position(tmp_path: Path) -> None:
    with spool(tmp_path) as sp:
        sp.append(lines(0, 10))
        _, c1 = sp.read(3)
        sp.ack(c1)
        _, c2 = sp.read(3)
        sp.ack(c2)
    raw = bytearray((tmp_path / CURSOR_FILE).read_bytes())
    slots = [json.loads(raw[i * 512 : (i + 1) * 512]) for i in (0, 1)]
    newest = max((0, 1), key=lambda i: slots[i]["seq"])
    assert (slots[newest]["segment"], slots[newest]["offset"]) == (c2.segment, c2.offset)
    raw[newest * 512 + 10 : newest * 512 + 40] = b"\x00" * 30  # a write torn by a crash
    (tmp_path / CURSOR_FILE).write_bytes(bytes(raw))
    with spool(tmp_path) as sp:
        assert drain(sp) == lines(3, 10)  # resends 3..5: at-least-once, never a gap


def test_unreadable_cursor_resends_from_the_oldest_line(tmp_path: Path) -> None:
    with spool(tmp_path) as sp:
        sp.append(lines(0, 5))
        _, cur = sp.read(2)
        sp.ack(cur)
    (tmp_path / CURSOR_FILE).write_bytes(b"garbage")
    with spool(tmp_path) as sp:
        # acked lines stay in their segment until it is wholly acked: they are resent
        # (at-least-once), nothing is skipped
        assert drain(sp) == lines(0, 5)


def test_second_owner_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    first = spool(tmp_path)
    with pytest.raises(SpoolError, match=r"in use by another process \(pid \d+\)"):
        spool(tmp_path)
    first.close()
    spool(tmp_path).close()


def test_unwritable_folder_raises_spool_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SpoolError, match="cannot create spool folder"):
        spool(blocker / "spool")
    with pytest.raises(SpoolError, match="no spool folder"):
        Spool(tmp_path / "missing", readonly=True)


def test_invalid_lines_are_refused(tmp_path: Path) -> None:
    with spool(tmp_path) as sp:
        with pytest.raises(ValueError):
            sp.append(["m v=1 1", ""])
        with pytest.raises(ValueError):
            sp.append(["m v=1 1\nm v=2 2"])
        with pytest.raises(ValueError):
            sp.read(0)
        assert sp.stats.depth_lines == 0


def test_disk_full_raises_spool_error_and_keeps_whole_lines(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes writes fail with EFBIG past 64 KiB, as a full disk would."""
    script = textwrap.dedent(
        f"""
        import json, resource, signal
        from pathlib import Path
        from rackplane.log import configure_logging
        from rackplane.io.spool import Spool, SpoolWriteError
        import sys
        configure_logging("error", "json", stream=sys.stderr)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))
        sp = Spool(Path({str(tmp_path)!r}), max_bytes=2**22, segment_bytes=2**20)
        n, err, written = 0, None, None
        for i in range(100000):
            batch = [f"m,rack=r1 v={{i}},pad=1234567890 {{i * 10 + j}}" for j in range(10)]
            try:
                sp.append(batch)
            except SpoolWriteError as e:
                err, written = str(e), e.lines_written
                n += written
                break
            n += 10
        print(json.dumps({{"n": n, "err": err, "depth": sp.stats.depth_lines}}))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    res = json.loads(out.stdout)
    assert res["err"] and "disk full" in res["err"]
    assert res["depth"] == res["n"] > 0
    with spool(tmp_path, max_bytes=2**22, segment_bytes=2**20) as sp:
        assert sp.stats.repaired_bytes == 0  # truncated back at once: no torn line
        got = drain(sp, 1000)
        assert len(got) == res["n"]
        assert all(line.startswith("m,rack=r1 v=") for line in got)


def test_readonly_reader_follows_the_owner_and_never_deletes(tmp_path: Path) -> None:
    owner = spool(tmp_path)
    owner.append(lines(0, 150))
    reader = Spool(tmp_path, readonly=True, cursor_file=REPLAY_CURSOR_FILE)
    assert reader.depth_lines == 150
    got = drain(reader, 40)
    owner.append(lines(150, 160))  # appears while reading
    got += drain(reader, 40)
    assert got == lines(0, 160)
    with pytest.raises(SpoolError):
        reader.append(["m v=1 1"])
    reader.close()
    assert owner.stats.depth_lines == 160  # the owner's cursor did not move
    owner.close()
    n_segs = len(segments(tmp_path))
    reader = Spool(tmp_path, readonly=True, cursor_file=REPLAY_CURSOR_FILE)
    assert reader.read(10)[0] == []  # resumes after what it acked
    reader.reset_to_start()
    assert drain(reader, 1000) == lines(0, 160)
    reader.close()
    assert len(segments(tmp_path)) == n_segs


def test_from_settings_uses_the_configured_sizes(tmp_path: Path) -> None:
    s = SpoolSettings(directory=tmp_path / "sp", max_bytes=2**20, segment_bytes=2**16)
    with Spool.from_settings(s) as sp:
        assert (sp.max_bytes, sp.segment_bytes) == (2**20, 2**16)
        assert (tmp_path / "sp" / segment_name(1)).exists()
        assert (tmp_path / "sp" / segment_name(1)).stat().st_size == HEADER_LEN


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(1, 40)),
            st.tuples(st.just("read_ack"), st.integers(1, 30)),
            st.tuples(st.just("read_only"), st.integers(1, 30)),
            st.tuples(st.just("reopen"), st.just(0)),
        ),
        max_size=40,
    )
)
def test_any_sequence_delivers_every_line_once_in_order(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]]
) -> None:
    d = tmp_path_factory.mktemp("prop")
    sp = spool(d, max_bytes=2**24, segment_bytes=1024)
    appended = 0
    delivered: list[str] = []
    try:
        for op, n in ops:
            if op == "append":
                sp.append(lines(appended, appended + n))
                appended += n
            elif op == "read_ack":
                got, cur = sp.read(n)
                delivered += got
                sp.ack(cur)
            elif op == "read_only":
                sp.read(n)
            else:
                sp.close()
                sp = spool(d, max_bytes=2**24, segment_bytes=1024)
            assert sp.stats.depth_lines == appended - len(delivered)
        delivered += drain(sp, 13)
    finally:
        sp.close()
    assert delivered == lines(0, appended)
    assert len(os.listdir(d)) <= 3  # one segment, the cursor, the lock
