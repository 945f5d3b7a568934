"""On call on a mix nobody tuned to: the example configuration as shipped, seeded mixes, then seeded faults.

    .venv/bin/python bench/soak.py --seeds 1,2,3 [--healthy-minutes 120] [--faults all|throttle,collapse] [--volumes 4]

Per seed: four stacked loop XFS volumes of 1 GiB (their lower images in RAM, so the host's own disk is not
under them); one daemon on config.example.toml with only its paths changed (state directory, listen address,
one [[targets]] per volume with the example's profiles and interval, the sampler's device filter); a real
Prometheus scraping every 15 s with the shipped rules and a real Alertmanager sending to a webhook receiver of
the bench's own. The healthy phase plays tests/integration/scenarios.py's `healthy(seed)` (database mixes on
daily cycles, backups buffered and direct, compactions, writeback storms, a WAL appender, defragmentation,
trims, a limited batch job, CPU pressure, I/O pressure elsewhere) and counts the notifications that reach the
webhook (the goal: none), the budget the routine probes spent, and the longest gap between two probes of one
target and profile against its interval. The fault phase plays `faults(seed)`: per fault the time to the
first notification for its volume, the alerts it raised, whether the text names the cause, and how long after
the fault's end every alert of the volume was resolved.

--shared-disk adds a device with one queue that every cgroup's requests wait in, which the loop volumes are not
(this kernel's loop device serves each cgroup on a worker of its own, and the tmpfs under it has no queue: a
neighbour in another cgroup costs the volume's own users nothing there). It is a loop device over an image a
FUSE process serves one request at a time (tests/integration/weakfuse.py --serial, 1 ms a request and 10 ms
more a MiB, the server's session at nice -10 so the mix's CPU pressure is not the disk's), read by a steady
service (`db-shared`: 4 KiB random reads, one at a time, SERVICE_IOPS) through the healthy phase and every
fault. The noisy-neighbour fault then floods that disk from a cgroup of its own (`noisy-batch`: 1 MiB reads at
QD32, a backup's), and the page it is owed names the culprit; the disk is read-only, as the flood is.

Needs root (loop devices, cgroup v1 blkio, mounts); each seed takes its healthy minutes plus about 20 minutes
per fault. Prints one table per seed and the scenario it played (the seed repeats it).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.integration import servers  # noqa: E402
from tests.integration.helpers import DaemonProc, blkio_cap, blkio_cgroup, end_processes, free_port, in_cgroup  # noqa: E402
from tests.integration.scenarios import FAULT_KINDS, Runner, Scenario, faults, fio, healthy  # noqa: E402
from tests.integration.soak_mix import stacked_volumes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "config.example.toml"
RULES = ROOT / "packaging" / "prometheus" / "iowarden.rules.yml"
CLEAR_WITHIN_S = 300
SERVICE_IOPS = 100         # the shared disk's steady service (--shared-disk)


def _example_target(text: str) -> tuple[int, str]:
    """Where the example's own target begins, and its block."""
    start = text.index("[[targets]]\nname = \"state\"")
    return start, text[start:text.index("\n\n", start)]


def example_interval_seconds() -> float:
    """The example target's interval, as configured: what each volume's cover is judged against."""
    return float(re.search(r"interval_seconds = ([\d.]+)", _example_target(EXAMPLE.read_text())[1]).group(1))


def example_config(state: Path, port: int, mounts: list[Path], devices: list[str]) -> str:
    """config.example.toml with its paths changed and nothing else: the state directory, the listen address,
    one target per volume in place of the example's own (its profiles and interval kept), the device filter."""
    text = EXAMPLE.read_text()
    text = text.replace('state_dir = "/var/lib/iowarden"', f'state_dir = "{state}"', 1)
    text = text.replace('listen_address = ":29110"', f'listen_address = "127.0.0.1:{port}"', 1)
    start, block = _example_target(text)
    profiles = re.search(r"profiles = (\[.*\])", block).group(1)
    interval = re.search(r"interval_seconds = ([\d.]+)", block).group(1)
    targets = "\n\n".join(f'[[targets]]\nname = "{m.name}"\npath = "{m}"\nprofiles = {profiles}\n'
                          f"interval_seconds = {interval}" for m in mounts)
    text = text[:start] + targets + text[start + len(block):]
    sampler = text.index("[sampler]")
    devices_line = text.index("devices = []", sampler)
    return text[:devices_line] + "devices = [" + ", ".join(f'"{d}"' for d in devices) + "]" + \
        text[devices_line + len("devices = []"):]


def metrics(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        out = {}
        for fam in text_string_to_metric_families(r.read().decode()):
            for s in fam.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out


def cgroup_latency(m: dict, device: str) -> dict:
    """{(cgroup, direction): (timed requests, seconds)} on one device since the daemon started (the tracer's
    histograms per cgroup)."""
    out: dict = {}
    for suffix, i in (("_count", 0), ("_sum", 1)):
        for labels, v in m.get("iowarden_cgroup_io_latency_seconds" + suffix, []):
            if labels.get("device") == device:
                key = (labels["cgroup"], labels["direction"])
                got = list(out.get(key, (0.0, 0.0)))
                got[i] = v
                out[key] = tuple(got)
    return out


def victims(before: dict, after: dict, culprit: str) -> str:
    """What each other cgroup's requests took during the fault against before it (mean per request), and the
    culprit's share of the fault's timed requests: whether the flood hurt anyone enough to be owed a page
    (the service rule's ratio is 8)."""
    said = []
    during = {k: (after[k][0] - before.get(k, (0, 0))[0], after[k][1] - before.get(k, (0, 0))[1]) for k in after}
    total = sum(n for n, _ in during.values())
    mine = sum(n for (cg, _), (n, _) in during.items() if culprit in cg)
    for (cg, direction), (n, secs) in sorted(during.items()):
        if culprit in cg or n < 20 or before.get((cg, direction), (0, 0))[0] < 20:
            continue
        usual = before[(cg, direction)][1] / before[(cg, direction)][0]
        said.append(f"{cg} {direction} {secs / n * 1e3:.2f} ms vs {usual * 1e3:.2f} ms before "
                    f"({secs / n / usual:.1f}x)")
    return (f"the culprit's share of timed requests {mine / total:.0%}; " if total else "no timed requests; ") + (
        "; ".join(said) or "no other cgroup timed")


def notifications(hook) -> list[dict]:
    """Every alert in every webhook payload, with the payload's status (firing or resolved)."""
    return [{**a, "payload_status": p["status"]} for p in hook.payloads for a in p["alerts"]]


class Coverage:
    """The longest gap between two successful probes of each target and profile, against its interval: a
    profile's as the daemon exports it (the budget's fit may stretch it), a volume's as configured (the promise:
    measured once an interval, however its profiles are spaced)."""

    def __init__(self, volume_interval_seconds: float):
        self.last: dict[tuple, float] = {}
        self.gap: dict[tuple, float] = {}
        self.interval: dict[tuple, float] = {}
        self.volume_interval_seconds = volume_interval_seconds
        # a success's time that went back: the gauge says when a probe last succeeded, which only moves on. A gap
        # is measured from the latest time seen, and each step back is counted and said, not measured from
        self.went_back: dict[tuple, int] = {}
        # (volume, profile) -> [looks it was armed at, looks]: a profile still learning cannot page, so "no
        # notifications" says something only for the time its profiles were armed
        self.armed: dict[tuple, list] = {}

    def look_armed(self, m: dict) -> None:
        now: dict[tuple, bool] = {}
        for labels, v in m.get("iowarden_baseline_learning", []):
            if labels.get("metric") in ("read_iops", "write_iops"):
                key = (labels["volume"], labels["profile"])
                now[key] = now.get(key, True) and v == 0.0
        for key, armed in now.items():
            seen = self.armed.setdefault(key, [0, 0])
            seen[0] += armed
            seen[1] += 1

    def armed_said(self, looks: int) -> str:
        """The share of the run's looks each volume's profiles were armed at, and when the last one armed."""
        if not self.armed:
            return "no profile armed or learning seen"
        shares = [seen[0] / max(looks, 1) for seen in self.armed.values()]
        return (f"{sum(1 for seen in self.armed.values() if seen[0])} of {len(self.armed)} volume profiles armed by the "
                f"end; armed {sum(shares) / len(shares):.0%} of the healthy time on average "
                f"(least {min(shares):.0%})")

    def look(self, m: dict, now: float) -> None:
        latest: dict[str, float] = {}
        for labels, v in m.get("iowarden_probe_last_success_timestamp_seconds", []):
            self._step((labels["target"], labels["profile"]), v)
            latest[labels["target"]] = max(latest.get(labels["target"], v), v)
        # the volume's: a probe of any of its profiles (the promise the scheduler keeps, plan.py)
        for target, v in latest.items():
            self._step((target, "any profile"), v)
        for labels, v in m.get("iowarden_probe_interval_seconds", []):
            self.interval[(labels["target"], labels["profile"])] = v
        self.interval.update({(target, "any profile"): self.volume_interval_seconds for target in latest})

    def _step(self, key: tuple, v: float) -> None:
        last = self.last.get(key)
        if last is not None and v > last:
            self.gap[key] = max(self.gap.get(key, 0.0), v - last)
        elif last is not None and v < last:
            self.went_back[key] = self.went_back.get(key, 0) + 1
        self.last[key] = v if last is None else max(last, v)

    def worst(self, volume: bool) -> tuple:
        """(gap in intervals, key, gap in seconds) of the longest gap: of a volume (any profile), or of one
        profile."""
        gaps = [(g / self.interval.get(k, self.volume_interval_seconds), k, g) for k, g in self.gap.items()
                if (k[1] == "any profile") == volume]
        return max(gaps) if gaps else (None, None, None)


def run_seed(seed: int, args) -> list[str]:
    report = []
    tmp = Path(tempfile.mkdtemp(prefix=f"iowarden-soak-{seed}-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, True)
        if args.keep:   # the daemon's log and state and every webhook payload, kept for a look after the run
            stack.callback(keep, tmp, Path(args.keep) / f"seed-{seed}", lambda: hook.payloads, lambda: played)
        played = []   # each fault's kind, volume and wall-clock window, kept for bench/contended_totals.py
        lowers, uppers = stacked_volumes(stack, tmp, args.volumes, in_ram=True)
        mounts = [u.mountpoint for u in uppers]
        for m in mounts:   # what the mix reads, laid out before it starts
            for name, size in (("db.dat", "128M"), ("backup.dat", "192M")):
                subprocess.run(fio("--name=layout", f"--filename={m / name}", "--rw=write", "--bs=1M",
                                   "--direct=1", f"--size={size}"), check=True, timeout=300)
        shared = None
        if args.shared_disk:
            from tests.integration.test_tail import weak_disks
            (shared,) = stack.enter_context(weak_disks(tmp, names=("shared.img",), server_nice=-10,
                                                       args=("--serial", "--service-ms", "1", "--ms-per-mib", "10")))
        elsewhere = tmp / "elsewhere"
        elsewhere.mkdir()
        port = free_port()
        daemon = DaemonProc(tmp, example_config(tmp / "state", port, mounts, [v.name for v in lowers + uppers]
                                                + ([shared] if shared else [])))
        stack.callback(daemon.close)
        daemon.wait_message("READY=1", timeout=120)
        hook = servers.Webhook()
        stack.callback(hook.stop)
        am, am_port = servers.alertmanager(tmp, hook.port)
        stack.callback(am.stop)
        prom, _ = servers.prometheus(tmp, port, rule_files=[RULES], interval="15s", alertmanager_port=am_port)
        stack.callback(prom.stop)

        if shared:
            service = subprocess.Popen(in_cgroup(stack.enter_context(blkio_cgroup("db-shared")), fio(
                "--name=service", f"--filename=/dev/{shared}", "--readonly", "--rw=randread", "--bs=4k",
                "--direct=1", "--iodepth=1", f"--rate_iops={SERVICE_IOPS}", "--time_based", "--runtime=86400")),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            stack.callback(end_processes, service)   # before the disk goes: its reads would fail with EIO
        scenario = healthy(seed, args.volumes, args.healthy_minutes * 60)
        report += scenario.said()
        runner = Runner(scenario, mounts, elsewhere)
        runner.start()
        stack.callback(runner.stop)
        coverage, started, looks = Coverage(example_interval_seconds()), time.monotonic(), 0
        while time.monotonic() - started < args.healthy_minutes * 60:
            time.sleep(15)
            m = metrics(port)
            coverage.look(m, time.monotonic())
            coverage.look_armed(m)
            looks += 1
        fired = [a for a in notifications(hook) if a["payload_status"] == "firing"]
        m = metrics(port)
        routine = {lab["device"]: v for lab, v in m.get("iowarden_budget_routine_device_time_used_seconds", [])}
        allowed = {lab["device"]: v for lab, v in m.get("iowarden_budget_device_time_allowed_seconds", [])}
        report.append(f"seed {seed}: healthy {args.healthy_minutes} min: {len(fired)} notifications"
                      + "".join(f"\n    {a['labels'].get('alertname')} {a['labels'].get('volume', '')} "
                                f"{a['labels'].get('device', a['labels'].get('target', ''))}: "
                                f"{a['annotations'].get('summary', '')[:300]}" for a in fired))
        report.append("  armed: " + coverage.armed_said(looks))
        report.append("  routine budget spent per disk (s, of allowed): "
                      + ", ".join(f"{d} {routine[d]:.0f}/{allowed.get(d, 0):.0f}" for d in sorted(routine)))
        for volume, what in ((True, "of one volume (any profile; the goal: 1 interval as configured)"),
                             (False, "of one volume's profile (its interval as the budget fitted it)")):
            worst = coverage.worst(volume)
            report.append(f"  longest gap between two probes {what}: {worst[0]:.2f} intervals ({worst[2]:.0f} s; "
                          f"{worst[1]})" if worst[0] is not None else f"  no probe gaps seen {what}")
        if coverage.went_back:
            report.append("  a probe's last success went back (not measured from): "
                          + ", ".join(f"{k} {n}x" for k, n in sorted(coverage.went_back.items())))
        runner.stop()
        report += ["  played: " + line for line in runner.log if "database mix" not in line][:80]
        before = len(hook.payloads)
        for fault in faults(seed, args.volumes, args.faults):
            began = time.time()
            played.append({"kind": fault.kind, "target": None if fault.volume is None else mounts[fault.volume].name,
                           "params": fault.params, "from": began, "to": began + fault.seconds})
            report.append(play_fault(fault, stack, lowers, uppers, scenario, hook, before, port, shared))
            before = len(hook.payloads)
    return report


IN_FLIGHT_SECONDS = 90.0   # a rule's `for` of a minute, Alertmanager's group wait and a scrape interval


def play_fault(fault, stack, lowers, uppers, scenario, hook, seen_before, port, shared: str | None = None) -> str:
    """One fault on a running mix: (time to the first notification for its volume, alerts, cause named,
    resolved after its end). shared: the shared disk (--shared-disk), where a noisy neighbour is played."""
    runner = Runner(Scenario(scenario.seed, scenario.databases, ()), [u.mountpoint for u in uppers])
    runner.start()
    v = fault.volume
    devices = {uppers[v].name, lowers[v].name} if v is not None else set()
    target = uppers[v].mountpoint.name if v is not None else None
    on_shared = fault.kind == "noisy-neighbour" and shared is not None
    if on_shared:
        devices, target = {shared}, None
    where = shared if on_shared else (uppers[v].name if v is not None else None)
    with ExitStack() as held:
        began = time.monotonic()
        if fault.kind in ("throttle", "collapse"):
            cap = max(10, int(scenario.databases[v].peak_iops * fault.params["of_load"]))
            held.enter_context(blkio_cap("read_iops_device", lowers[v].major_minor, cap))
            held.enter_context(blkio_cap("write_iops_device", lowers[v].major_minor, cap))
        elif on_shared:
            traced_before = cgroup_latency(metrics(port), shared)
            runner._spawn("noisy-batch", fio("--name=noisy", f"--filename=/dev/{shared}", "--readonly",
                                             "--rw=randread", "--bs=1M", "--direct=1", "--iodepth=32",
                                             "--time_based", f"--runtime={int(fault.seconds)}"),
                          runner.cgroup("noisy-batch"))
        elif fault.kind == "noisy-neighbour":
            traced_before = cgroup_latency(metrics(port), uppers[v].name)
            cg = runner.cgroup("noisy-batch")
            runner._spawn("noisy-batch", fio("--name=noisy", f"--filename={uppers[v].mountpoint / 'noisy.dat'}",
                                             "--size=128M", "--rw=randwrite", "--bs=4k", "--direct=1", "--iodepth=16",
                                             "--startdelay=1", "--time_based", f"--runtime={int(fault.seconds)}"), cg,
                           scratch=uppers[v].mountpoint / "noisy.dat")
        elif fault.kind == "host-contention":
            for i, u in enumerate(uppers):
                runner._spawn("host contention", fio("--name=hog", f"--filename={u.mountpoint / 'hog.dat'}",
                                                     "--size=128M", "--rw=randrw", "--bs=4k", "--direct=1",
                                                     "--iodepth=32", "--time_based", f"--runtime={int(fault.seconds)}"),
                               scratch=u.mountpoint / "hog.dat")
            for _ in range(2):
                runner._spawn("cpu", ["timeout", str(int(fault.seconds)), "sh", "-c", "while :; do :; done"])
        elif fault.kind == "scheduler-drift":
            path = Path(f"/sys/block/{lowers[v].name}/queue/scheduler")
            offered = path.read_text().split()
            old = next(n.strip("[]") for n in offered if n.startswith("["))
            # the seed's scheduler where this kernel has it (bfq is a module not every kernel carries), else the
            # first other one it offers: the fault is the change of setting, whichever it is
            others = [n for n in offered if not n.startswith("[")]
            drifted_to = fault.params["scheduler"] if fault.params["scheduler"] in others else others[0]
            path.write_text(drifted_to)
            held.callback(path.write_text, old)
            fault = dataclasses.replace(fault, params={**fault.params, "scheduler": drifted_to, "was": old})
        elif fault.kind == "filling":
            fill = uppers[v].mountpoint / "filling.dat"
            free = shutil.disk_usage(uppers[v].mountpoint).free
            subprocess.run(["fallocate", "-l", str(int(free * 0.95)), str(fill)], check=False)
            held.callback(lambda: fill.unlink(missing_ok=True))
        def of_fault(a) -> bool:
            """An alert about the faulted volume (its mount or either layer of its stack); every alert for a
            fault of the whole host."""
            return fault.volume is None or a["labels"].get("target") == target or a["labels"].get("device") in devices
        def firing() -> list:
            return [a for p in hook.payloads[seen_before:] for a in p["alerts"] if p["status"] == "firing" and of_fault(a)]
        first = None
        while time.monotonic() - began < fault.seconds:
            time.sleep(5)
            mine = firing()
            if mine and first is None:
                first = (time.monotonic() - began, mine[0])
    ended = time.monotonic()
    resolved_after = None
    hurt = ""
    if fault.kind == "noisy-neighbour":
        m = metrics(port)
        up = [v for _, v in m.get("iowarden_tracer_up", [])]
        hurt = (f"\n    measured (tracer {'up' if up and up[0] else 'off'} at the end): "
                + victims(traced_before, cgroup_latency(m, where), "noisy-batch"))

    def key(a):
        lab = a["labels"]
        return lab.get("alertname"), lab.get("volume"), lab.get("target"), lab.get("device")
    # resolved: every alert of the faulted volume; an alert of another volume is a false page, said apart. One
    # raised by the daemon just before the end is still on its way (the rule's `for`, Alertmanager's group wait):
    # it is waited for IN_FLIGHT_SECONDS and counted, said as late, rather than the fault called missed
    while time.monotonic() - ended < 600:
        time.sleep(5)
        last = {key(a): a["status"] for p in hook.payloads[seen_before:] for a in p["alerts"] if of_fault(a)}
        if first is None:
            mine = firing()
            if mine:
                first = (time.monotonic() - began, mine[0])
            elif time.monotonic() - ended < IN_FLIGHT_SECONDS:
                continue
        if all(status == "resolved" for status in last.values()):
            resolved_after = time.monotonic() - ended
            break
    runner.stop()
    sent = [a for p in hook.payloads[seen_before:] for a in p["alerts"]]
    raised = sorted({(a["labels"].get("alertname"), a["labels"].get("volume", "")) for a in sent if of_fault(a)})
    elsewhere = {key(a): a for a in sent if not of_fault(a) and a["status"] == "firing"}
    # the page as a pager shows it: its summary (where, what moved, the settings' old and new values) and then
    # its description (the cause); the description alone read as a generic line for a drift or a full volume
    said = (" | ".join(first[1]["annotations"].get(k, "")[:400] for k in ("summary", "description"))
            if first else "")
    return (f"  fault {fault.kind} on {shared if on_shared else 'the host' if v is None else f'vol{v}'} ({json.dumps(fault.params)}) for "
            f"{fault.seconds:.0f} s: first notification "
            + (f"after {first[0]:.0f} s ({first[1]['labels'].get('alertname')}"
               + (", after the fault's end)" if first[0] > fault.seconds else ")") if first else "none")
            + f"; alerts {raised}; resolved "
            + (f"{resolved_after:.0f} s after its end" if resolved_after is not None else "not within 10 min")
            + f"; {len(elsewhere)} alerts of other volumes"
            + hurt + (f"\n    text: {said}" if said else "")
            + "".join(f"\n    elsewhere: {k[0]} {k[3] or k[2]}: {a['annotations'].get('summary', '')[:300]}"
                      for k, a in elsewhere.items()))


def keep(tmp: Path, to: Path, payloads, played) -> None:
    to.mkdir(parents=True, exist_ok=True)
    for f in tmp.glob("daemon-*.log"):
        shutil.copy(f, to / f.name)
    if (tmp / "state").is_dir():
        shutil.copytree(tmp / "state", to / "state", dirs_exist_ok=True, ignore=shutil.ignore_patterns("probes"))
    (to / "faults.json").write_text(json.dumps(played(), indent=1))
    try:
        (to / "webhook.json").write_text(json.dumps(payloads(), indent=1))
    except NameError:   # the seed ended before its receiver started
        pass


def provenance(args) -> str:
    """What a run's figures belong to, for docs/soaks.md: the code's commit (and whether it had changes beside it),
    the example configuration's digest, the command, and the machine's cores and load when it began."""
    def git(*a) -> str:
        try:
            return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""
    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = " with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    digest = hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()[:12]
    load = Path("/proc/loadavg").read_text().split()[:3]
    # the tracer's engine decides whether a noisy neighbour can be named per service: the bpftrace fallback keeps no
    # count per cgroup (a soak run from a tree without the compiled engine left its neighbour unnamed)
    from iowarden.daemon.sources.tracer_proc import compiled_missing
    from iowarden.probes.common import Roots
    missing = compiled_missing(Roots())
    engine = f"tracer: {'the compiled engine' if missing is None else 'bpftrace only, ' + missing}"
    return (f"soak {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: commit {commit}{dirty}; "
            f"config.example.toml sha256 {digest}; seeds {args.seeds}, healthy {args.healthy_minutes:g} min, "
            f"faults {','.join(args.faults) or 'none'}{', shared disk' if args.shared_disk else ''}; "
            f"{engine}; {os.cpu_count()} cores, load {' '.join(load)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--seeds", default="1", help="comma-separated seeds")
    ap.add_argument("--healthy-minutes", type=float, default=120.0)
    ap.add_argument("--faults", default="all", help=f"all, none, or some of {', '.join(FAULT_KINDS)}")
    ap.add_argument("--volumes", type=int, default=4)
    ap.add_argument("--shared-disk", action="store_true",
                    help="a one-queue disk with a steady service beside the volumes; noisy neighbours are played there")
    ap.add_argument("--keep", default="", help="a directory to keep each seed's daemon log, state and webhook payloads in")
    args = ap.parse_args()
    args.faults = () if args.faults == "none" else FAULT_KINDS if args.faults == "all" else tuple(args.faults.split(","))
    header = provenance(args)
    print(header, flush=True)
    for seed in (int(s) for s in args.seeds.split(",")):
        report = "\n".join(run_seed(seed, args))
        print(report, flush=True)
        if args.keep:   # beside the seed's log and payloads, the figures docs/soaks.md records
            (Path(args.keep) / f"seed-{seed}" / "report.txt").write_text(header + "\n" + report + "\n")


if __name__ == "__main__":
    main()
