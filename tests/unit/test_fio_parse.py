"""fio JSON in seconds and bytes: fio 3 outputs captured here, fio 2.x written from its stat.c."""
import json
import math

import pytest

from iowarden.probes import fio
from iowarden.probes.common import ParseError
from tests.conftest import FIXTURES

F = FIXTURES / "fio"


def test_fio3_randrw_matches_the_raw_json():
    text = (F / "fio-3.33-randrw-json+.json").read_text()
    raw = json.loads(text)["jobs"][0]
    rep = fio.parse(text)
    assert rep.fio_version == "fio-3.33" and rep.error == 0
    for name in ("read", "write"):
        d, r = rep.directions[name], raw[name]
        assert d.iops == pytest.approx(r["iops"]) and d.bw_bytes == r["bw_bytes"] and d.io_bytes == r["io_bytes"]
        assert d.clat.mean_seconds == pytest.approx(r["clat_ns"]["mean"] * 1e-9)
        assert d.clat_percentiles_seconds[99.9] == pytest.approx(r["clat_ns"]["percentile"]["99.900000"] * 1e-9)
        # histogram: cumulative, ascending, total equals the sample count
        les = [le for le, _ in d.clat_histogram]
        counts = [c for _, c in d.clat_histogram]
        assert les == sorted(les) and counts == sorted(counts)
        assert counts[-1] == r["clat_ns"]["N"] == sum(r["clat_ns"]["bins"].values())
    assert "loop0" in rep.disk_util_percent


def test_histogram_quantile_brackets_fios_own_percentiles():
    rep = fio.parse((F / "fio-3.33-randrw-json+.json").read_text())
    d = rep.directions["read"]
    for p in (50.0, 99.0, 99.9):
        q = fio.histogram_quantile(d.clat_histogram, p / 100)
        # fio reports the bucket's representative value; the upper edge is at most ~1/128 above it
        assert d.clat_percentiles_seconds[p] <= q <= d.clat_percentiles_seconds[p] * (1 + 1 / 64) + 1e-9


@pytest.mark.parametrize("value,edge", [(0, 0), (127, 127), (129, 130), (255, 256), (1004, 1008),
                                        (4016, 4032), (53504, 53760)])
def test_bin_upper_edges_follow_fios_bucket_layout(value, edge):
    assert fio.bin_upper_edge_ns(value) == edge


def test_two_jobs_with_a_leading_text_line_are_summed():
    text = (F / "fio-3.33-two-jobs-json+.json").read_text()
    assert not text.startswith("{")
    raw = json.loads(text[text.index("{"):])["jobs"]
    rep = fio.parse(text)
    d = rep.directions["read"]
    assert rep.jobs == 2
    assert d.iops == pytest.approx(sum(j["read"]["iops"] for j in raw))
    assert d.total_ios == sum(j["read"]["total_ios"] for j in raw)
    assert d.clat_histogram[-1][1] == sum(j["read"]["clat_ns"]["N"] for j in raw)
    assert d.clat.min_seconds == pytest.approx(min(j["read"]["clat_ns"]["min"] for j in raw) * 1e-9)


def test_fio2_units_are_converted():
    rep = fio.parse((F / "fio-2.20-json+.json").read_text())
    d = rep.directions["read"]
    assert set(rep.directions) == {"read"}           # empty write/trim are left out
    assert d.io_bytes == 409600 * 1024 and d.bw_bytes == 40960 * 1024
    assert d.iops == 10240 and d.runtime_seconds == 10.0
    assert d.clat.mean_seconds == pytest.approx(95.5e-6)
    assert d.clat_percentiles_seconds[99.99] == pytest.approx(4016e-6)
    assert d.clat_histogram[-1] == (pytest.approx(4032e-6), 102400)
    assert rep.disk_util_percent == {"sdb": 97.5}


def test_job_error_is_reported():
    rep = fio.parse((F / "fio-3.33-error-eisdir.json").read_text())
    assert rep.error == 21


@pytest.mark.parametrize("text,match", [
    ("", "no JSON"),
    ("fio: engine libaio not loadable", "no JSON"),
    ('{"jobs": [', "not valid JSON"),
    ('{"jobs": []}', "no jobs"),
    ('{"jobs": [{"read": {"iops": 1}}]}', "neither clat_ns"),
    ('{"jobs": [{"read": {"iops": "many", "clat_ns": {}}}]}', "not a finite number"),
])
def test_bad_output_is_a_parse_error(text, match):
    with pytest.raises(ParseError, match=match):
        fio.parse(text)


def test_truncated_real_output_is_a_parse_error():
    text = (F / "fio-3.33-randrw-json+.json").read_text()
    for cut in (10, len(text) // 3, len(text) - 5):
        with pytest.raises(ParseError):
            fio.parse(text[:cut])


def test_histogram_quantile_of_nothing_is_nan():
    assert math.isnan(fio.histogram_quantile([], 0.5))


def test_the_write_budget_counts_the_ramp_fio_leaves_out_of_its_report():
    from iowarden.probes.fio_run import ProbeResult
    rep = fio.parse((F / "fio-3.33-randrw-json+.json").read_text())
    w = rep.directions["write"]
    measured = ProbeResult("t", "/srv", "sdb", "rw", True, None, 1.7e9, 6.0, rep)
    assert measured.write_io_bytes == w.io_bytes
    ramped = ProbeResult("t", "/srv", "sdb", "rw", True, None, 1.7e9, 6.0, rep, ramp_seconds=1.0)
    assert ramped.write_io_bytes == int(w.io_bytes + w.bw_bytes) > w.io_bytes
