"""`rackplane.core.polling`: what a poller delivers for points no reply covered (BR-07)."""

from __future__ import annotations

from rackplane.core.polling import all_stale, mark_stale
from rackplane.core.registers import load_register_map
from rackplane.core.samples import Quality, Sample, good


def test_all_stale_has_no_value_and_keeps_the_order() -> None:
    points = load_register_map("cdu-generic").points
    out = all_stale(points, "timeout", 5, 2.0)
    assert [s.point for s in out] == [p.name for p in points]
    assert all(s.quality is Quality.STALE and s.value is None and s.reason == "timeout"
               and s.t_mono == 2.0 and s.ts_ns == 5 for s in out)


def test_mark_stale_keeps_what_was_read_earlier_in_the_poll() -> None:
    points = load_register_map("cdu-generic").points
    read = good(points[0].name, 45.0, points[0].unit, 1, 1.0)
    out: dict[str, Sample] = {read.point: read}
    mark_stale(out, [p for p in points if p.name not in out], "connection_lost", 2, 1.5)
    assert out[read.point] is read
    assert {s.reason for n, s in out.items() if n != read.point} == {"connection_lost"}
