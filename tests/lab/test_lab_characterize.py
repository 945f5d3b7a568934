"""`iowarden characterize --compare` on two real stacks over disks of one speed (seed 003): an md
RAID0 of two disks against one disk, each disk capped at the same IOPS by QEMU. The RAID0 reads
about twice one disk's IOPS, and the comparison's table and plot show it."""
from __future__ import annotations

import json
import subprocess
import sys

from PIL import Image  # matplotlib's own dependency

from .sweep import characterize

CAP_IOPS = 150


def test_compare_raid0_of_two_against_one_disk(lab, tmp_path):
    g = lab.guest
    for disk in ("ca", "cb", "cc"):
        g.throttle(disk, CAP_IOPS)
    try:
        pair = characterize(lab, "/srv/pair")
        single = characterize(lab, "/srv/single")
    finally:
        for disk in ("ca", "cb", "cc"):
            g.throttle(disk, 0)
    sat_pair = pair["findings"]["qd"]["saturation_iops"]
    sat_single = single["findings"]["qd"]["saturation_iops"]
    # one disk saturates at its cap; two striped reach about twice that
    assert 0.8 * CAP_IOPS <= sat_single <= 1.15 * CAP_IOPS, sat_single
    assert 1.6 <= sat_pair / sat_single <= 2.3, (sat_pair, sat_single)

    a, b = tmp_path / "single.json", tmp_path / "pair.json"
    a.write_text(json.dumps(single))
    b.write_text(json.dumps(pair))
    cli = [sys.executable, "-m", "iowarden.daemon.cli", "characterize", "--compare", str(a), str(b)]
    table = subprocess.run(cli + ["--out", str(tmp_path / "cmp")], capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    deepest = max(p["value"] for p in single["points"] if p["sweep"] == "qd")
    row = next(line for line in table.stdout.splitlines() if line.split()[:2] == ["qd", str(deepest)])
    change = float(row.split()[-1].rstrip("%"))
    # the table's change is the two runs' own figures at that depth, and the pair's is well above one disk's;
    # "about twice" is held above by the saturation IOPS, not by one 3 s step: under TCG on a busy host the one
    # disk's deepest step once read 113 IOPS under its 150 cap (+146 %) while its saturation was within bounds
    one, two = (next(p["iops"] for p in run["points"] if p["sweep"] == "qd" and p["value"] == deepest)
                for run in (single, pair))
    own = 100 * (two / one - 1)
    assert abs(change - own) <= 0.15 and change >= 60, (row, own)
    plot = tmp_path / "cmp" / "compare.png"
    with Image.open(plot) as img:
        assert img.format == "PNG" and img.size[0] >= 400 and img.size[1] >= 300
        assert len(img.convert("RGB").getcolors(1 << 20) or []) > 10, "a blank plot"
    js = json.loads(subprocess.run(cli + ["--json"], capture_output=True, text=True, check=True).stdout)
    points = {p["value"]: p for p in js["points"] if p["sweep"] == "qd"}
    assert points[deepest]["b_iops"] / points[deepest]["a_iops"] >= 1.6
    print(f"characterize --compare: one disk {sat_single:.0f} IOPS, RAID0 of two {sat_pair:.0f} IOPS "
          f"(cap {CAP_IOPS} each)\n{table.stdout}")
