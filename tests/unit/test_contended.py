"""Contended probes judged by what the busy device delivered in total, and where that judgement does not hold:
a probe too shallow to fill the device alone (issue 33's week bench: healthy volumes paged by their qd1 probe
under a database mix, the device's total 3-5x below the qd1 probe's quiet figure). Fake data, no root."""
from iowarden.daemon.core.state import State
from iowarden.daemon.verdicts.detect import DetectorParams
from iowarden.daemon.verdicts.health import Health
from iowarden.probes.fio_run import ProbeResult
from tests.unit.test_policy import _contended, _result


def _armed(tmp_path):
    """A volume with a deep profile (rr) and a shallow one (qd1), both learned."""
    st = State(str(tmp_path / "s.db"))
    h = Health(st, DetectorParams(warmup_probes=6))
    for i in range(8):
        h.on_result(_result(i, 1000.0 * (1 + 0.01 * (i % 3))), "vol", lambda since: [])
        h.on_result(_qd1(_result(i, 500.0 * (1 + 0.01 * (i % 3)))), "vol", lambda since: [])
    return st, h


def _qd1(record):
    return {**record, "profile": "qd1"}


def _busy(delivered_iops, depth, slowdown=None):
    ctx = {"delivered_iops": delivered_iops, "delivered_bytes_per_second": delivered_iops * 4096,
           "probe_queue_depth": depth}
    if slowdown is not None:
        ctx["passive_slowdown"] = slowdown
    return ctx


def test_a_shallow_contended_probe_delivering_little_in_total_raises_nothing_a_deep_one_does(tmp_path):
    st, h = _armed(tmp_path)
    causes = lambda since: []   # noqa: E731
    for i in range(8, 14):   # qd1 behind a database's work: the total is what its users asked, not the device's best
        assert h.on_result(_qd1(_contended(i, 40.0)), "vol", causes, _busy(120.0, 1)) == []
    assert "VolumeDegraded" not in {a[0] for a in h.open}
    assert h.on_result(_contended(14, 80.0), "vol", causes, _busy(150.0, 32)) == []
    assert h.on_result(_contended(15, 80.0), "vol", causes, _busy(150.0, 32)) == ["VolumeDegraded raised"]
    st.close()


def test_a_shallow_probes_alert_clears_on_the_passive_view_only_when_the_volumes_deep_probe_is_not_short(tmp_path):
    st, h = _armed(tmp_path)
    causes = lambda since: []   # noqa: E731
    h.on_result(_qd1(_result(8, 1.0)), "vol", causes)
    assert h.on_result(_qd1(_result(9, 1.0)), "vol", causes) == ["VolumeDegraded raised"]
    # a deep contended probe short in total: a limit above the block layer, which the passive view cannot see
    h.on_result(_contended(10, 100.0), "vol", causes, _busy(300.0, 32, slowdown=1.0))
    assert h.on_result(_qd1(_contended(11, 50.0)), "vol", causes, _busy(300.0, 1, slowdown=1.0)) == []
    h.on_result(_contended(12, 400.0), "vol", causes, _busy(900.0, 32, slowdown=1.0))   # the limit lifted
    assert h.on_result(_qd1(_contended(13, 50.0)), "vol", causes, _busy(300.0, 1, slowdown=1.0)) == \
        ["VolumeDegraded cleared"]
    st.close()


def test_a_probes_queue_depth_is_read_from_its_fio_command():
    r = ProbeResult("t", "/p", "sda", "rr", True, None, 0.0, 1.0)
    assert r.queue_depth is None
    r.argv = ["fio", "--output-format=json+", "--name=rr", "--iodepth=32", "--numjobs=2", "--filename=/x"]
    assert r.queue_depth == 64
    r.argv = ["fio", "--name=a", "--iodepth=1"]
    assert r.queue_depth == 1


def test_an_alert_raised_on_the_busy_totals_is_not_cleared_by_one_quiet_probe_between_busy_ones(tmp_path):
    """The week lane's two pages for one fault: a limit below a write cache (the file under a loop device) held
    the busy device's total at a third while a quiet write probe, landing in the cache, read its baseline; it
    cleared the alert and the next busy probe raised it again. Two quiet probes in a row at baseline clear it,
    as does the busy device delivering its normal in total."""
    st, h = _armed(tmp_path)
    causes = lambda since: []   # noqa: E731
    h.on_result(_contended(8, 80.0), "vol", causes, _busy(150.0, 32))
    assert h.on_result(_contended(9, 80.0), "vol", causes, _busy(150.0, 32)) == ["VolumeDegraded raised"]
    assert h.on_result(_result(10, 1000.0), "vol", causes) == []                      # quiet, at its baseline
    assert h.on_result(_contended(11, 80.0), "vol", causes, _busy(150.0, 32)) == []   # busy and short: still open
    assert h.on_result(_result(12, 1000.0), "vol", causes) == []                      # the count began again
    assert h.on_result(_result(13, 1000.0), "vol", causes) == ["VolumeDegraded cleared"]
    # the episode's end ended its run of short busy probes: one short one is a blip (the week lane's second
    # page: the host disk under every volume slow for a minute), two in a row raise it again; the busy device
    # delivering its normal in total clears it at once
    assert h.on_result(_contended(14, 80.0), "vol", causes, _busy(150.0, 32)) == []
    assert h.on_result(_contended(15, 80.0), "vol", causes, _busy(150.0, 32)) == ["VolumeDegraded raised"]
    assert h.on_result(_contended(16, 80.0), "vol", causes, _busy(900.0, 32)) == ["VolumeDegraded cleared"]
    st.close()



def test_a_busy_healthy_volume_short_of_its_quiet_figure_by_less_than_five_times_raises_nothing(tmp_path):
    """The week lane's false page: a neighbour's throttle filled the host's dirty pages and a
    healthy volume's busy randread-4k probe delivered 4,126 IOPS in total against its quiet 14,787 (3.6x short),
    twice in a row. A busy total depends on what the other work asks; under a fifth is a limit or a collapse."""
    st, h = _armed(tmp_path)
    causes = lambda since: []   # noqa: E731
    for i in range(8, 14):
        assert h.on_result(_contended(i, 100.0), "vol", causes, _busy(1000.0 / 3.6, 32)) == []
    assert "VolumeDegraded" not in {a[0] for a in h.open}
    assert h.on_result(_contended(14, 50.0), "vol", causes, _busy(190.0, 32)) == []
    assert h.on_result(_contended(15, 50.0), "vol", causes, _busy(190.0, 32)) == ["VolumeDegraded raised"]
    st.close()


def test_an_alert_the_busy_device_cleared_is_not_raised_again_by_a_quiet_probe_back_at_its_baseline(tmp_path):
    """The week lane's second page: two quiet probes at a tenth of normal raised VolumeDegraded on
    the probe's own figures; the busy device then delivered its normal in total, which closed it, while the
    detectors were still counting their probes back in band. The next quiet probe, at its baseline, was still
    "alerting" in that count and raised a second page saying the latency was 0.38x higher."""
    st, h = _armed(tmp_path)
    causes = lambda since: []   # noqa: E731
    h.on_result(_result(8, 100.0), "vol", causes)
    assert h.on_result(_result(9, 100.0), "vol", causes) == ["VolumeDegraded raised"]
    assert h.on_result(_contended(10, 400.0), "vol", causes, _busy(1100.0, 32)) == ["VolumeDegraded cleared"]
    for i in (11, 12):   # back at its baseline, the detectors not yet done counting it back: no page
        assert h.on_result(_result(i, 1000.0), "vol", causes) == []
    assert "VolumeDegraded" not in {a[0] for a in h.open}
    # a fault back while the detectors are still counting is paged again, at once
    assert h.on_result(_result(13, 100.0), "vol", causes) == ["VolumeDegraded raised"]
    assert ("VolumeDegraded", "vol", "rr") in h.open
    st.close()
