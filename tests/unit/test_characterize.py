"""The characterize policy: the plan, its budget, the knee and the IOPS-to-bandwidth turn, on numbers."""
import pytest

from iowarden.daemon.commands import characterize as ch


def qd_points(cap=2000.0, per_io_seconds=0.0004):
    """A volume that serves `1/per_io_seconds` IOPS per queue slot up to a ceiling (Little's law)."""
    out = []
    for q in ch.QD_STEPS:
        iops = min(q / per_io_seconds, cap)
        out.append(ch.Point("qd", q, iops, iops * 4096, q / iops, None, None))
    return out


def test_the_knee_is_the_depth_that_reaches_the_ceiling_and_saturation_the_ceiling():
    depth, sat = ch.knee(qd_points())
    assert sat == 2000.0
    assert depth == 1          # 1 slot at 0.4 ms is 2,500 IOPS: capped from the start
    depth, sat = ch.knee(qd_points(cap=20000.0))
    assert depth == 8 and sat == 20000.0   # 8 slots reach 20,000; 16 only add latency


def test_a_volume_that_keeps_scaling_has_its_knee_at_the_deepest_step():
    assert ch.knee(qd_points(cap=1e9))[0] == 64


def test_failed_steps_are_not_points_of_the_curve():
    pts = qd_points(cap=20000.0) + [ch.Point("qd", 128, 0.0, 0.0, None, None, None, ok=False, error="boom")]
    assert ch.knee(pts) == (8, 20000.0)
    assert ch.knee([]) == (None, None)


def test_bandwidth_bound_from_the_block_size_that_reaches_the_bytes_ceiling():
    iops_cap, bps_cap = 2000.0, 32 * 2 ** 20
    pts = [ch.Point("bs", b, min(iops_cap, bps_cap / b), min(iops_cap * b, bps_cap), None, None, None)
           for b in ch.BS_STEPS]
    assert ch.bandwidth_bound_from(pts) == 16384


def test_one_step_bursting_above_the_plateau_does_not_move_where_the_volume_turns_bandwidth_bound():
    """A blk-throttle cap of 32 MiB/s let one step through at 35.1 MiB/s: against that one step, 16k blocks
    (31.4 MiB/s, at the cap) were not "bandwidth-bound" and the sweep said 32k."""
    mib = 1 << 20
    bw = {4096: 7.9, 8192: 15.8, 16384: 31.4, 32768: 32.2, 65536: 32.4, 131072: 32.6, 262144: 35.1,
          524288: 32.6, 1048576: 32.8}
    pts = [ch.Point("bs", b, v * mib / b, v * mib, None, None, None) for b, v in bw.items()]
    assert ch.bandwidth_bound_from(pts) == 16384
    assert not ch.still_rising_after(pts, 16384)
    assert ch.bandwidth_bound_from(pts[:1]) == 4096 and ch.still_rising_after(pts, 8192)


def test_the_plan_its_time_budget_and_the_write_budget():
    steps = ch.plan(["qd", "bs"], 2 ** 30, 3.0, 1.0, writes=True)
    assert [s.sweep for s in steps].count("qd-write") == len(ch.QD_STEPS)
    kept, dropped = ch.within_budget(steps, 60.0)
    assert sum(ch.step_seconds(s) for s in kept) <= 60.0 and dropped and kept + dropped == steps
    # the next write step may take what is left of the bytes budget, in whole blocks; it is left out when
    # not even one as large as the largest so far would fit
    assert ch.write_step_cap(4 * 2 ** 30, 2 ** 30, 2 ** 30, 4096) == 3 * 2 ** 30
    assert ch.write_step_cap(200 * 2 ** 20, 64 * 2 ** 20 + 4097, 0, 4096) == 136 * 2 ** 20 - 8192
    assert ch.write_step_cap(4 * 2 ** 30, 3 * 2 ** 30 + 1, 2 ** 30, 4096) is None
    assert ch.write_step_cap(4096 * 3, 4096 * 2 + 1, 0, 4096) is None
    with pytest.raises(ValueError, match="unknown sweep 'zz'"):
        ch.plan(["zz"], 2 ** 30, 3.0, 1.0, writes=False)
    # every block-size step keeps the one probe file (no second layout)
    assert {s.profile.size_bytes for s in steps if s.sweep == "bs"} == {2 ** 30}


def test_a_cache_knee_found_by_doubling_is_narrowed_by_midpoints_to_a_quarter():
    mk = lambda ws, iops: ch.Point("working-set", ws * 2 ** 20, iops, iops * 4096, None, None, None)  # noqa: E731
    doubling = [mk(64, 33e3), mk(128, 32e3), mk(256, 620), mk(512, 300)]
    assert ch.next_knee_point(doubling) == 192 * 2 ** 20
    # the cache is about 170 MiB: 192 falls too, 160 is still served from it; then the bracket is narrow
    assert ch.next_knee_point(doubling + [mk(192, 2.9e3)]) == 160 * 2 ** 20
    assert ch.next_knee_point(doubling + [mk(192, 2.9e3), mk(160, 31e3)]) is None
    assert ch.cache_knee(doubling + [mk(192, 2.9e3), mk(160, 31e3)]) == 160 * 2 ** 20
    # a cache of about 230 MiB: 192 is served, 224 between is measured, then no more
    assert ch.next_knee_point(doubling + [mk(192, 31e3)]) == 224 * 2 ** 20
    assert ch.next_knee_point(doubling + [mk(192, 31e3), mk(224, 30e3)]) is None
    # no knee: nothing to narrow; a middle that failed is not tried again (the run would never end)
    assert ch.next_knee_point([mk(64, 9e3), mk(128, 8.5e3)]) is None
    failed = ch.Point("working-set", 192 * 2 ** 20, 0.0, 0.0, None, None, None, ok=False, error="x")
    assert ch.next_knee_point(doubling + [failed]) is None
    steps = ch.working_set_steps(192 * 2 ** 20, 2.0, 1.0, buffered=True)
    assert [(s.sweep, s.value >> 20) for s in steps] == [("warm", 192), ("working-set", 192)]


def test_the_cache_knee_is_the_last_working_set_served_at_the_cache_speed():
    mk = lambda ws, iops: ch.Point("working-set", ws * 2 ** 20, iops, iops * 4096, None, None, None)  # noqa: E731
    assert ch.cache_knee([mk(64, 370e3), mk(128, 345e3), mk(256, 17e3), mk(512, 7e3)]) == 128 * 2 ** 20
    assert ch.cache_knee([mk(64, 9e3), mk(128, 8.5e3), mk(256, 9.1e3)]) is None   # no cache in the sizes swept
    steps = ch.plan(["working-set"], 2 ** 30, 2.0, 1.0, writes=False, largest_working_set=300 * 2 ** 20,
                    buffered=True)
    assert [(s.sweep, s.value >> 20) for s in steps] == [("warm", 64), ("working-set", 64), ("warm", 128),
                                                         ("working-set", 128), ("warm", 256), ("working-set", 256)]
    measured = steps[1].profile.job_dicts()[0][1]
    assert measured["invalidate"] == "0" and measured["direct"] == "0"   # the warmed cache is what is measured
    assert ch.step_seconds(steps[1]) == pytest.approx(3.5)


def test_compare_puts_two_runs_side_by_side():
    a = [{"sweep": "qd", "value": 1, "iops": 1000.0, "ok": True}, {"sweep": "qd", "value": 2, "iops": 1800.0, "ok": True}]
    b = [{"sweep": "qd", "value": 1, "iops": 1500.0, "ok": True}, {"sweep": "qd", "value": 4, "iops": 3000.0, "ok": True}]
    rows = ch.compare(a, b)
    assert rows[0] == ("qd", 1, 1000.0, 1500.0, pytest.approx(0.5))
    assert rows[1] == ("qd", 2, 1800.0, None, None) and rows[2] == ("qd", 4, None, 3000.0, None)


def test_each_plot_is_a_real_image_of_the_expected_size_with_its_series_in_it(tmp_path):
    import numpy as np
    from matplotlib.image import imread

    from iowarden.daemon.commands import characterize_plots as cp
    pts = qd_points(cap=20000.0)
    pts += [ch.Point("bs", b, min(2000, 2 ** 25 / b), min(2000 * b, 2 ** 25), None, None, None) for b in ch.BS_STEPS]
    pts += [ch.Point("working-set", w << 20, i, 0, None, None, None) for w, i in ((64, 3.7e5), (128, 3.4e5), (256, 1.7e4))]
    found = {"qd": {"knee_depth": 8}, "bs": {"bandwidth_bound_from_bytes": 16384},
             "working-set": {"cache_knee_bytes": 128 << 20}}
    from iowarden.daemon.commands.outdir import OutDir
    out = OutDir(str(tmp_path))
    made = cp.write_plots(pts, found, out, "test volume")
    assert [p.rsplit("/", 1)[1] for p in made] == ["qd.png", "bs.png", "working-set.png"]
    blue, red, green = (0x1f, 0x77, 0xb4), (0xd6, 0x27, 0x28), (0x2c, 0xa0, 0x2c)
    colours = {"qd.png": (blue, red), "bs.png": (blue, green), "working-set.png": (blue,)}
    for path in made:
        img = imread(path)
        assert 400 < img.shape[0] < 560 and 600 < img.shape[1] <= 800, img.shape   # 7 x 4.6 in at 110 dpi, cropped
        rgb = (img[:, :, :3] * 255).round().astype(int)
        for want in colours[path.rsplit("/", 1)[1]]:          # IOPS in blue in every plot, and the second measure
            assert (np.abs(rgb - np.array(want)).sum(axis=2) < 10).sum() > 300, (path, want)
    assert (tmp_path / "qd.svg").read_text().lstrip().startswith("<?xml")
    rows = ch.compare([p.__dict__ for p in pts], [{**p.__dict__, "iops": p.iops * 2} for p in pts])
    compare = cp.write_compare_plot(rows, ("a.json", "b.json"), out, "compare.png")
    assert imread(compare).shape[0] > 400 * 2                 # one panel per sweep


def test_every_plot_has_iops_on_the_left_and_a_legend_naming_its_lines():
    """On main IOPS moved between the left and right axes from one plot to the next, and no plot had a legend."""
    from iowarden.daemon.commands import characterize_plots as cp
    plt = cp.pyplot()
    pts = [ch.Point("bs", b, 1000.0, 1000.0 * b, 1e-3, 2e-3, 3e-3) for b in ch.BS_STEPS]
    found = {"bs": {"bandwidth_bound_from_bytes": 16384}}
    for sweep, spec in cp._SWEEPS.items():
        fig = cp.sweep_figure(plt, [ch.Point(sweep, p.value, p.iops, p.bw_bytes, p.mean_latency_seconds,
                                              p.p99_seconds, p.p999_seconds) for p in pts], found, sweep, **spec)
        left = fig.axes[0]
        assert left.get_ylabel() == "IOPS" and left.lines[0].get_label() == "IOPS"
        legend = [t.get_text() for t in left.get_legend().get_texts()]
        assert legend[0] == "IOPS" and len(legend) == len(fig.axes) + (sweep == "bs"), (sweep, legend)
        if sweep == "bs":
            assert legend[1:] == ["bandwidth (MiB/s)", "bandwidth-bound from 16k"]
        plt.close(fig)


def test_a_capped_write_step_stops_at_its_bytes_whatever_its_runtime():
    from iowarden.probes.fio_run import ProbeLimits, build_argv
    step = next(s for s in ch.plan(["qd"], 2 ** 30, 3.0, 1.0, writes=True) if s.sweep == "qd-write")
    capped = ch.capped_at(step.profile, 10 * 2 ** 20 + 100)
    assert capped.writes and capped.name == step.profile.name
    argv = build_argv(capped, "f", ProbeLimits(), readonly=False)
    # io_size counts the ramp's writes too; a time-based job would ignore it
    assert "--io_size=10485760" in argv and "--time_based=0" in argv and "--rw=randwrite" in argv
    two = ch.capped_at(ch.replace(step.profile, numjobs=2), 10 * 2 ** 20)
    assert "--io_size=5242880" in build_argv(two, "f", ProbeLimits(), readonly=False)


def test_a_step_starts_only_if_it_ends_within_the_time_budget_by_the_clock():
    step = ch.plan(["qd"], 2 ** 30, 3.0, 1.0, writes=False)[0]   # 1 s ramp + 3 s + 0.5 s to start fio
    assert ch.step_fits(0.0, step, 4.5) and ch.step_fits(5.5, step, 10.0)
    assert not ch.step_fits(5.6, step, 10.0)   # the estimate fits the plan, the clock says otherwise


def test_the_headline_quotes_the_figure_of_the_block_size_it_names():
    """On main: "bandwidth-bound from 128k blocks (4,103.9 MiB/s)", the 256k figure."""
    from iowarden.daemon.commands.characterize_report import findings, render_tables
    mib = 1 << 20
    bw = {4096: 400, 16384: 1500, 65536: 3000, 131072: 3900, 262144: 4103.9, 1 << 20: 4000}
    pts = [ch.Point("bs", b, v * mib / b, v * mib, 1e-3, 2e-3, 3e-3) for b, v in bw.items()]
    found = findings(pts)
    assert found["bs"]["bandwidth_bound_from_bytes"] == 131072 and found["bs"]["best_bw_block_bytes"] == 262144
    text = render_tables(pts, found)
    assert "bandwidth-bound from 128k blocks (3,900.0 MiB/s there; 4,103.9 MiB/s at most, at 256k)" in text, text
    assert "p99 usec" in text and "2000" in text   # latency columns in one unit, fio's


def test_a_step_out_of_its_sweeps_line_or_beside_other_work_is_measured_again_and_left_out_if_still_so():
    """QD8 29,184 IOPS then QD16 3,862 (the device was busy) made 'knee at 8'; a rerun said 32."""
    from iowarden.daemon.commands import characterize as ch
    from iowarden.daemon.commands.characterize_report import findings, render_tables

    def qd(depth, iops, **kw):
        return ch.Point("qd", depth, iops, iops * 4096, 1e-3, 2e-3, 3e-3, **kw)
    earlier = [qd(1, 5000), qd(2, 9000), qd(4, 16000), qd(8, 29184)]
    why = ch.step_problem(qd(16, 3862), earlier)
    assert why and "out of line" in why and "29,184" in why
    assert ch.step_problem(qd(16, 27000), earlier) is None          # past the knee IOPS hold: in line
    busy = ch.step_problem(qd(16, 30000), earlier, own_bytes=100 << 20, device_bytes=130 << 20)
    assert busy and "busy with something else" in busy             # 30 MiB of other work beside 100
    assert ch.step_problem(qd(16, 30000), earlier, own_bytes=100 << 20, device_bytes=105 << 20) is None
    assert ch.step_problem(ch.Point("mix", 0, 100, 1, None, None, None), earlier) is None   # falls by design
    # measured again: in line the second time, it counts; out of line again, it is left out and said
    good = ch.settle(qd(16, 3862), qd(16, 30500), None)
    assert good.first_iops == 3862 and not good.suspect
    bad = ch.settle(qd(32, 4000), qd(32, 4100), "out of line")
    found = findings(earlier + [good, bad, qd(64, 30600)])
    assert found["qd"]["knee_depth"] == 8 and round(found["qd"]["saturation_iops"]) == 30600
    c = found["qd"]["confidence"]
    assert c["measured_again"] == [16, 32] and c["left_out"] == [32] and not c["trusted"]
    assert 0.87 < c["repeat_spread"] < 0.88
    text = render_tables(earlier + [good, bad], found)
    assert "steps 32 out of line twice" in text and "left out" in text
    # a block-size step whose MB/s fall as blocks grow is out of line too
    bs = [ch.Point("bs", 4096, 20000, 20000 * 4096, None, None, None)]
    assert "MiB/s" in ch.step_problem(ch.Point("bs", 8192, 2000, 2000 * 8192, None, None, None), bs)


def test_no_line_crosses_a_legend_in_any_plot():
    """The right axis's line was drawn over the legend and crossed out its text: every legend is below the axes,
    its box clear of every axes' box (where all the lines are), in each sweep's plot and the comparison."""
    from iowarden.daemon.commands import characterize_plots as cp
    plt = cp.pyplot()
    pts = [ch.Point("qd", q, 100.0 * q, 4096.0 * 100 * q, 1e-3, 2e-3 * q, 3e-3 * q) for q in (1, 2, 4, 8, 16, 32, 64)]
    figures = [cp.sweep_figure(plt, [ch.replace(p, sweep=sweep) for p in pts], {"qd": {"knee_depth": 16}}, sweep, **spec)
               for sweep, spec in cp._SWEEPS.items()]
    both = [ch.replace(p, sweep=s) for p in pts for s in ("qd", "bs")]
    rows = ch.compare([p.__dict__ for p in both], [{**p.__dict__, "iops": p.iops * 2} for p in both])
    figures.append(cp.compare_figure(plt, rows, ("a.json", "b.json")))
    for fig in figures:
        fig.tight_layout()   # as every plot is laid out before it is saved
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is None:
                continue
            box = legend.get_window_extent(renderer)
            for other in fig.axes:
                assert not box.overlaps(other.bbox), (ax.get_title(), box, other.bbox)
        plt.close(fig)


def test_a_step_left_out_is_drawn_as_such_and_a_knee_at_the_last_step_is_not_drawn():
    from iowarden.daemon.commands import characterize_plots as cp
    from iowarden.daemon.commands.characterize_report import findings
    plt = cp.pyplot()
    pts = [ch.Point("qd", q, 100.0 * q, 0.0, 1e-3, 2e-3, 3e-3) for q in (1, 2, 4, 8)]
    pts[1] = ch.replace(pts[1], iops=10.0, suspect="out of line twice")
    found = findings(pts)
    assert found["qd"]["beyond_range"] and found["qd"]["knee_depth"] == 8   # IOPS still rising at the deepest
    fig = cp.sweep_figure(plt, pts, found, "qd", **cp._SWEEPS["qd"])
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "left out of the findings (out of line twice)" in labels and not any("knee" in x for x in labels), labels
    iops_line = fig.axes[0].lines[0]
    assert list(iops_line.get_xdata()) == [1, 4, 8]   # the line joins only the steps the findings rest on
    plt.close(fig)


def test_steps_a_budget_left_out_are_named_in_the_findings_and_the_tables():
    """A requested jobs sweep dropped by the budget was named nowhere, and the findings said "trusted"."""
    from iowarden.daemon.commands.characterize_report import findings, render_tables
    pts = [ch.Point("qd", q, 1000.0 * min(q, 8), 0.0, 1e-3, 2e-3, 3e-3) for q in (1, 2, 4, 8, 16)]
    gaps = [{"sweep": "qd", "step": "QD 32", "why": "the run reached --budget-seconds 60"},
            {"sweep": "jobs", "step": "1 job", "why": "--budget-seconds 60: not in the plan that fits it"},
            {"sweep": "jobs", "step": "2 jobs", "why": "--budget-seconds 60: not in the plan that fits it"}]
    found = findings(pts, gaps)
    assert found["qd"]["knee_depth"] == 8 and not found["qd"]["beyond_range"]
    assert found["qd"]["not_measured"] == ["QD 32"] and found["qd"]["confidence"]["trusted"] is False
    assert found["jobs"]["not_measured"] == ["1 job", "2 jobs"]
    text = render_tables(pts, found)
    assert "jobs: not measured: the whole sweep, steps 1 job, 2 jobs (--budget-seconds 60: not in the plan" in text
    assert "qd: not measured: steps QD 32 (the run reached --budget-seconds 60)" in text
    assert "knee at queue depth 8" in text


def test_a_turn_at_the_largest_block_is_beyond_the_range_not_a_turn():
    from iowarden.daemon.commands.characterize_report import findings, render_tables
    pts = [ch.Point("bs", b, 1000.0, 1000.0 * b, 1e-3, 2e-3, 3e-3) for b in ch.BS_STEPS]   # MiB/s still rising
    found = findings(pts)
    assert found["bs"]["beyond_range"], found
    text = render_tables(pts, found)
    assert "no turn to bandwidth-bound within the block sizes measured" in text and "bandwidth-bound from" not in text
