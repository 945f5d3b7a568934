"""`iowarden xfs` and `settings`: what the daemon samples, shown once or every few seconds."""
from __future__ import annotations

import os
import stat
import sys

from iowarden.probes import blockqueue, cpupower, xfs
from iowarden.probes.common import Roots, printable

from iowarden.daemon.commands.tables import dumps, human_bytes, table
from iowarden.daemon.commands.tables import print_lines as _print


# ---- xfs ------------------------------------------------------------------------------------

def cmd_xfs(args) -> int:
    roots = Roots()
    if args.file:
        counts = {}
        for f in args.file:
            try:
                st = os.lstat(f)
                if not stat.S_ISREG(st.st_mode):
                    # a FIFO would block the open for ever; a device or socket has no extents
                    raise ValueError(f"xfs --file {f}: not a regular file (only files have extents)")
                counts[f] = xfs.file_extent_count(f)
            except OSError as exc:  # missing, a symlink (not followed), or no FIEMAP on its filesystem
                raise SystemExit(f"iowarden xfs: cannot count the extents of {f}: {exc.strerror or exc}") from None
        _print(dumps(counts) if args.json else table(["file", "extents"], counts.items()))
        return 0
    mounts = xfs.xfs_mounts(roots)
    if args.mounts:
        wanted = [m.rstrip("/") or "/" for m in args.mounts]
        known = {mnt: dev for dev, mnt in mounts}
        missing = [m for m in wanted if m not in known]
        if missing:
            raise SystemExit(f"iowarden xfs: not an XFS mount point: {', '.join(missing)}")
        mounts = [(known[m], m) for m in wanted]
    reports = [xfs.read(mnt, dev, args.timeout) for dev, mnt in mounts]
    _print(dumps(reports) if args.json else xfs_text(reports))
    if args.json:   # the text says them after the table; a script reading the JSON needs the exit status's why
        for r in reports:
            for e in r.errors:
                print(f"iowarden xfs: {printable(r.mountpoint)}: {printable(e, 400)}", file=sys.stderr)
    return 0 if all(not r.errors for r in reports) else 1


def xfs_text(reports) -> str:
    """The summary table, then per filesystem its geometry and free-space histogram (xfs_spaceman's rows), as
    `--json` has them; then what could not be read."""
    rows = []
    for r in reports:
        f, fs = r.frag, r.free_space
        rows.append([r.mountpoint, r.device, f and f.actual_extents, f and f.ideal_extents,
                     f and f.fragmentation_ratio * 100, f and f.extents_per_file,
                     fs and fs.total_free_extents, fs and fs.average_free_extent_blocks,
                     r.free_space_source or "-"])
    out = [table(["mount", "device", "extents", "ideal", "frag %", "extents/file",
                  "free extents", "avg free ext (blocks)", "free-space source"], rows)]
    for r in reports:
        g, fs = r.geometry, r.free_space
        if g is None and fs is None:
            continue
        out.append("")
        if g is not None:
            stripe = (f"stripe unit {g.sunit_blocks} blocks, width {g.swidth_blocks} blocks" if g.sunit_blocks
                      else "no stripe")
            out.append(f"{printable(r.mountpoint)}: {human_bytes(g.block_size_bytes * g.data_blocks)} in "
                       f"{g.data_blocks:,} blocks of {human_bytes(g.block_size_bytes)}, {g.ag_count} allocation groups "
                       f"of {g.ag_size_blocks:,} blocks, {stripe}, inodes of {g.inode_size_bytes} bytes, reflink "
                       + ("unknown" if g.reflink is None else "on" if g.reflink else "off"))
        if fs is not None and fs.buckets:
            out.append(f"{printable(r.mountpoint)}: free space by extent size ({r.free_space_source or '-'})")
            out.append(table(["from (blocks)", "to (blocks)", "extents", "blocks", "%"],
                             [[b.from_blocks, b.to_blocks, b.extents, b.blocks, b.percent] for b in fs.buckets]))
    out += [f"{printable(r.mountpoint)}: {printable(e, 400)}" for r in reports for e in r.errors]
    return "\n".join(out)


# ---- settings -------------------------------------------------------------------------------

def settings_table(devices: dict, partitions: bool = False) -> str:
    """One row per block device. The identity goes last: a loop device's backing path can be hundreds of
    characters, and in the middle it widened every row of the table."""
    rows = []
    for d in devices.values():
        if d.kind == "partition" and not partitions:
            continue
        if d.kind == "loop" and not d.size_bytes:
            continue  # an unattached loop device is not storage
        q = d.queue
        md = d.md and f"{d.md.level} {d.md.array_state} degraded={d.md.degraded}"
        rows.append([d.name, d.kind, q and q.scheduler, q and q.nr_requests, q and q.read_ahead_kb,
                     q and q.max_sectors_kb, q and q.rotational, q and q.write_cache, md or "-", d.identity])
    return table(["device", "kind", "scheduler", "nr_requests", "read_ahead_kb", "max_sectors_kb", "rotational",
                  "write_cache", "md", "identity"], rows)


def cmd_settings(args) -> int:
    roots = Roots()
    devices = blockqueue.read_sysfs_and_superblocks(roots)
    power = cpupower.read_power_settings(roots, run_tuned_adm_verify=True)
    if args.json:
        _print(dumps({"block_devices": devices, "power": power}))
        return 0
    _print(settings_table(devices, args.partitions))
    _print("")
    qos = power.pm_qos_cpu_dma_latency_usec
    if qos is None:
        qos_text = "absent"
    elif power.c_states_limited:
        qos_text = f"{qos} us requested (C-states limited)"
    else:
        qos_text = "no request"   # the kernel's default, 2000 s, means nobody asked for a limit
    _print(f"cpuidle: driver={power.idle_driver or '-'} governor={power.idle_governor or '-'}; "
           f"PM QoS cpu_dma_latency: {qos_text}")
    govs = sorted(set(power.cpufreq_governors.values()))
    _print(f"cpufreq governor: {', '.join(govs) if govs else 'absent'}; intel_pstate: "
           f"{power.intel_pstate.get('status') if power.intel_pstate else 'absent'}")
    t = power.tuned
    _print(f"tuned: profile={t.active_profile or 'absent'} mode={t.profile_mode or '-'} "
           f"verify={'-' if t.verify_ok is None else ('ok' if t.verify_ok else 'FAILED: ' + (t.verify_message or ''))}")
    if power.cpus:
        cpu0 = power.cpus[0]
        shares = cpu0.residency_shares()
        _print(table(["cpu0 idle state", "exit latency us", "target residency us", "disabled", "time share"],
                     [[s.name, s.exit_latency_usec, s.target_residency_usec, s.disabled,
                       shares.get(s.name)] for s in cpu0.states]))
    return 0


# ---- run ------------------------------------------------------------------------------------
