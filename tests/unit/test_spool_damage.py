"""The InfluxDB spool's segments carry a checksum per point: a damaged point is counted as rejected and never
forwarded, and every undamaged point is sent.

Landed code: flipped bytes were forwarded as they were, a segment cut mid-line or full of NULs was "replayed
0 spooled points", and the counters said everything was written, 0 rejected.
"""
import random

from iowarden.daemon.outputs.influx import SEGMENT_HEADER, InfluxWriter, Spool, decode_segment, encode_segment

LINES = [f"iowarden_probe,target=t{i},profile=randread read_iops={1000 + i}.5,p99={i}e-4 {1_700_000_000 + i}000000000"
         for i in range(12)]


def _spans(data: bytes) -> list[tuple[int, int]]:
    """Each point's byte range in an encoded segment (its checksum, its line and its line feed)."""
    spans, at = [], len(SEGMENT_HEADER)
    for raw in data[len(SEGMENT_HEADER):].split(b"\n")[:-1]:
        spans.append((at, at + len(raw) + 1))
        at += len(raw) + 1
    return spans


def test_fuzz_byte_by_byte_a_damaged_point_is_never_forwarded_and_every_other_one_is():
    data = encode_segment(LINES)
    assert decode_segment(data) == (LINES, 0)
    spans = _spans(data)
    rng = random.Random(52)
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= rng.randrange(1, 256)
        good, bad = decode_segment(bytes(damaged))
        assert set(good) <= set(LINES), i            # nothing that was not spooled is ever sent
        hit = [n for n, (a, b) in enumerate(spans) if a <= i < b]
        if i < len(SEGMENT_HEADER):
            assert good == LINES                      # a damaged header costs no point
        elif data[i:i + 1] == b"\n":
            # a line feed damaged joins two points into one line, which fails its sum: both are lost, said
            assert len(good) >= len(LINES) - 2 and bad >= 1, i
        else:   # one point damaged (two lines of it, where the damage made a line feed)
            assert good == [ln for n, ln in enumerate(LINES) if n not in hit], i
            assert bad in ((1,) if damaged[i:i + 1] != b"\n" else (1, 2)), i


def test_a_cut_segment_and_a_segment_of_nuls_are_counted_not_sent():
    data = encode_segment(LINES)
    cut = data[:len(data) - 30]
    good, bad = decode_segment(cut)
    assert good == LINES[:-1] and bad == 1
    assert decode_segment(b"\0" * 4096) == ([], 1)
    assert decode_segment(b"\0" * 100 + b"\n" + b"\0" * 100 + b"\n") == ([], 2)


def test_a_segment_from_before_the_sums_is_still_sent():
    good, bad = decode_segment(("\n".join(LINES) + "\n").encode())
    assert good == LINES and bad == 0


def test_the_writer_counts_damaged_points_as_rejected_and_sends_only_whole_ones(tmp_path):
    spool = Spool(str(tmp_path / "spool"), 1 << 20)
    spool.append(LINES)
    (path,) = spool.segments()
    data = bytearray(open(path, "rb").read())
    a, b = _spans(bytes(data))[3]
    data[a + 20] ^= 0x55
    open(path, "wb").write(bytes(data))
    sent = []
    writer = InfluxWriter("http://127.0.0.1:9", "o", "b", "t", str(tmp_path / "spool"), 1 << 20)
    writer._write = lambda text: sent.append(text) or "ok"
    writer.flush()
    assert sent == ["\n".join(LINES[:3] + LINES[4:]) + "\n"]
    assert writer.points_rejected_total == 1 and writer.points_written_total == len(LINES) - 1
    assert not spool.segments()
