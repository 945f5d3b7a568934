"""Per-volume health: baselines fed by probe results, and the alerts they raise, with causes.

Keys are the volume's stable identity (WWN, serial, by-id, filesystem or dm/md
UUID, loop backing file), never the kernel name: a disk that comes back as sdc
keeps its history. One alert per (volume, profile) carries every metric that
deviates, so one degradation pages once.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from iowarden.probes.vocabulary import metrics_of

from iowarden.daemon.alert_kinds import severity_of
from iowarden.daemon.snapshot import NOT_PROBE_PROFILES, PASSIVE_PROFILE
from iowarden.daemon.verdicts import contended
from iowarden.daemon.verdicts.advice import advice_of
from iowarden.daemon.verdicts.changes import (AlertClosed, AlertRaised, AlertUpdated, BaselineSaved, BaselinesDropped,
                                              PinChanged, Said)
from iowarden.daemon.verdicts.detect import Detector, DetectorParams
from iowarden.daemon.probing.pins import pin_refusal, stable_identity
from iowarden.daemon.verdicts.sentence import alert_text

log = logging.getLogger("iowarden")

FAILURES_BEFORE_ALERT = 2
# A probe taken while the host's other disks serve their loads at twice their normal latency or more (their median,
# passive/host.py) measured the host as much as the volume: neither learned nor paged (HostSlow says the host),
# unless the volume's own device is twice as slow as they are (an array dragged by a slow member on a slow host).
HOST_SHARED_SLOWDOWN = 2.0
# A probe's clock runs in fio's process: on a host whose CPUs are starved (PSI cpu "some" over 10 s at this share
# or more: at least one runnable task waiting for a CPU most of the time) fio reaps each completion late, and a qd1
# read's 16 us normal read 300 us (19x) while the passive view of the same device served its database at 0.9-1.0x
# its normal latency for its load. There a probe out of its band measured the CPU: neither learned nor paged (one
# within its band is learned as ever, and a volume still learning arms as ever), unless the device
# agrees (its own latency at its load contended.STARVED_DEVICE_AGREES_SLOWDOWN times its normal or more, the same
# agreement a busy disk's short total needs on a starved CPU) or a cgroup limit on its stack explains a slow probe
# the device's latency cannot show (a throttled bio waits above the device's counters). A device with no judged
# window at all (idle, or its curve not learned yet) cannot agree or not: there a probe is judged only where its
# throughput fell as far as a collapse (docs/detector.md, the starved CPU).
CPU_STARVED_PERCENT = contended.CPU_STARVED_PERCENT
# A latency less than this above its normal is not a page however many spreads it is: on a fast device (a qd1
# read of 11 us) CPU contention alone doubles it. The passive detector's floor_ms, the same 20 us.
LATENCY_FLOOR_SECONDS = 20e-6
# A probe's p99.9 is its slowest few I/Os: one stall of the host (a neighbour's throttle filling the dirty pages)
# moved a healthy volume's read-1m p99.9 to 17x and nothing else. Alone it is not a page; beside a metric that
# moved it is said (a tail-only fault of the device is the passive tail rule's, on every I/O it serves).
TAIL_ONLY = frozenset({"clat_p999_seconds"})
MOVED_Z = 2.0                # past the band's edge (baseline x e^(2 spreads)): a metric that moved, said in the page
JOURNAL_TEXT_CHARS = 2000    # the journal's sentence: every cause whole (a label value is cut shorter)


def slowed_host(context: dict) -> str | None:
    """Why a probe's figures are its host's rather than its volume's (said in the probe's journal line), or None.
    context: the passive view of the probe's device and host (core/knowledge.py): host_slowdown, own_slowdown."""
    host, own = context.get("host_slowdown") or 0, context.get("own_slowdown")
    if host >= HOST_SHARED_SLOWDOWN and (own is None or own < HOST_SHARED_SLOWDOWN * host):
        return (f"the host's other disks served their loads at {host:.1f}x their normal latency meanwhile: "
                "measured on a slowed host, not judged as the volume's own")
    return None


def starved_cpu(context: dict) -> tuple[float, float | None] | None:
    """(the CPU's pressure in %, the device's own slowdown or None where it has no reading) when a probe out of
    its band may be the CPU's rather than its volume's, or None: the host's CPUs starved, the device not agreeing
    (serving its own load under contended.STARVED_DEVICE_AGREES_SLOWDOWN times its normal latency, or with no
    judged window to say), and no cgroup limit on its stack.
    The device's bar is the one a busy disk's short total meets on a starved CPU: a loop or virtio device
    completes its requests on a kernel thread that waits for the CPU too, so part of its own latency is the
    CPU's. On the example configuration beside a starved host (tasks waiting for a CPU 98 % of the time) healthy
    loop volumes' quiet probes read 12x and 54x their normal p50 (the device at 1.33x, and with no reading yet)
    and 2.6x under their normal 1 MiB read throughput (the device at 0.95x), and paged.
    context: cpu_pressure_some_percent, own_slowdown, slowest_member_now, cgroup_limited (core/knowledge.py)."""
    cpu, own = context.get("cpu_pressure_some_percent"), context.get("own_slowdown")
    if cpu is None or cpu < CPU_STARVED_PERCENT or context.get("cgroup_limited"):
        return None
    if own is not None and own >= contended.STARVED_DEVICE_AGREES_SLOWDOWN:
        return None
    member = context.get("slowest_member_now")
    if member is not None and member[1] >= contended.STARVED_DEVICE_AGREES_SLOWDOWN:
        return None   # an array's own latency dilutes its slow member's with its peers': the member agrees for it
    return float(cpu), None if own is None else float(own)


@dataclass
class OpenAlert:
    id: int
    alert: str
    severity: str
    metrics: dict = field(default_factory=dict)
    target: str = ""
    raised_at: float = 0.0
    causes: tuple = ()
    acked_by: str | None = None        # who acknowledged it (`iowarden ack`), why and when (unix time)
    ack_note: str | None = None
    mountpoint: str | None = None      # where it was raised: the sentence's place
    devices: tuple = ()
    acked_at: float | None = None


@dataclass(frozen=True)
class Saved:
    """What the state database holds of health, read once at start (core/effects.py reads it)."""
    pins: Mapping = field(default_factory=lambda: MappingProxyType({}))
    baselines: tuple = ()        # (identity, profile, metric, learned_at, detector state) rows
    open_alerts: tuple = ()      # the open alerts' rows, as the state database gives them
    next_alert_id: int = 1       # alert ids are never reused: the next after every one ever raised


NOWHERE = (None, ())   # (mount point, devices) of an alert whose place is not known


class Health:
    def __init__(self, params: DetectorParams = DetectorParams(), saved: Saved = Saved()):
        """Owned by the core: every method runs on the core's thread (probe workers read the pins from the
        snapshot, outputs the views), so there is no lock; the evidence of a judgement is gathered first.

        It decides and keeps its verdicts' memory; every method that judges returns what changed
        (verdicts/changes.py), and the core acts on it: nothing here writes, logs a page or calls out."""
        self.params = params
        self._changes: list = []
        self.next_alert_id = saved.next_alert_id
        self.detectors: dict[tuple[str, str, str], Detector] = {}
        self.learned_at: dict[tuple[str, str, str], float] = {}
        self.open: dict[tuple[str, str, str], OpenAlert] = {}   # (alert name, identity, profile)
        self.failures: dict[tuple[str, str], int] = {}
        self.latest: dict[tuple[str, str], dict] = {}              # (identity, profile) -> verdicts per metric
        self.contended_strikes: dict[str, contended.Strikes] = {}   # volume -> its short contended probes lately
        # (identity, profile) whose last probe ran on a busy device short in total: the next one, soon, says
        # whether it is the volume (a collapse of five minutes outlasts an interval between two such probes)
        self.last_short: set[tuple[str, str]] = set()
        self.deep_short: dict[str, bool] = {}   # volume -> was its last deep (saturating) contended probe short
        self.quiet_good: dict[tuple, int] = {}  # alert raised on a busy device's totals -> quiet probes at baseline since
        # target name -> the volume identity it was first probed on: a directory whose
        # filesystem is no longer mounted must not be probed on the disk beneath it
        self.pins: dict[str, str] = dict(saved.pins)
        for identity, profile, metric, learned_at, st in saved.baselines:
            if profile in NOT_PROBE_PROFILES:
                continue   # the passive detector's curves (passive_part), characterize's capability, sources
            try:   # a row that decodes but is not a baseline is learned again; the rest load
                self.detectors[(identity, profile, metric)] = Detector.from_state(st, params)
                self.learned_at[(identity, profile, metric)] = learned_at
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                log.error("baseline %s/%s/%s in the state database is damaged (%s)", identity, profile, metric, exc)
        for a in saved.open_alerts:
            try:
                where = a["evidence"].get("where") or {}
                self.open[(a["alert"], a["identity"], a["profile"])] = OpenAlert(
                    a["id"], a["alert"], severity_of(a["alert"]), dict(a["evidence"].get("metrics", {})), a["target"],
                    a["raised_at"], tuple(a["causes"]), (a.get("ack_by") or "unknown") if a.get("acked_at") else None,
                    a.get("ack_note"), where.get("mountpoint"), tuple(where.get("devices") or ()),
                    a.get("acked_at"))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                log.error("open alert %s in the state database is damaged (%s); it is left out", a.get("id"), exc)

    def open_alert_views(self) -> list:
        from iowarden.daemon.snapshot import AlertView
        return [AlertView(k[0], k[1], k[2], a.target, a.severity, a.raised_at, a.id,
                          tuple((m, v.get("value"), v.get("baseline")) for m, v in a.metrics.items()),
                          tuple(a.causes), a.acked_by, a.ack_note, a.mountpoint, a.devices, a.acked_at)
                for k, a in self.open.items()]

    def baseline_views(self) -> list:
        """Every baseline with its latest verdict, read in one go (for a snapshot)."""
        from iowarden.daemon.snapshot import BaselineView
        views = []
        for (volume, profile, metric), det in self.detectors.items():
            base = det.baseline()
            verdict = self.latest.get((volume, profile), {}).get(metric)
            # the verdict's score when there is one; after a restart, the detector's own view of its
            # last value; during warm-up none at all (not 0: nothing was judged)
            score = verdict.z if verdict is not None and not verdict.learning else det.deviation()
            views.append(BaselineView(volume, profile, metric, math.exp(base[0]) if base else None,
                                      base[1] if base else None, score, len(det.values), base is None))
        return views

    def short_on_busy(self) -> frozenset:
        """(identity, profile) whose last probe ran on a busy device and came short in total, or fell to a
        collapse's share of its normal on a starved CPU and was set aside (for a snapshot): the next is soon."""
        return frozenset(self.last_short)

    def baseline_since(self, identity: str, profile: str) -> float:
        times = [t for (i, p, _), t in self.learned_at.items() if i == identity and p == profile]
        return min(times) if times else time.time()

    def pin_refusal(self, target: str, identity: str | None) -> str | None:
        return pin_refusal(self.pins, target, identity)

    def _take(self) -> list:
        out, self._changes = self._changes, []
        return out

    def apply_requests(self, requests, identity_of_target) -> list:
        """Operator requests from `iowarden baseline accept|reset` and `iowarden ack` (queued in the state
        database): (action, target, profile, ack), ack being (who, note) of an acknowledged alert whose id is
        the target, or None. Returns what changed."""
        for action, target, profile, ack in requests:
            if action == "ack":
                self._take_ack(target, ack)
                continue
            if action == "reset" and target and target in self.pins:
                del self.pins[target]
                self._changes.append(PinChanged(target, None))
            for key in list(self.detectors):
                ident, prof, _ = key
                if target and identity_of_target(target) != ident or profile and prof != profile:
                    continue
                det = self.detectors[key]
                if action == "accept":
                    det.accept_new_normal(list(det.recent))
                else:
                    del self.detectors[key]
                    self.learned_at.pop(key, None)
                    self._changes.append(BaselinesDropped(ident, prof))
                self._changes.append(Said(logging.WARNING, "baseline %s for %s %s %s (operator request)",
                                          (action, ident, prof, key[2]), {"VOLUME": ident, "PROBE": prof}))
                if action == "accept" and key in self.detectors:
                    self.learned_at[key] = time.time()
                    self._changes.append(BaselineSaved(ident, prof, key[2], self.learned_at[key], det.to_state()))
            for akey, a in list(self.open.items()):
                if a.alert == "VolumeDegraded" and (not profile or akey[2] == profile) and \
                        (not target or identity_of_target(target) == akey[1]):
                    self._close(akey, "baseline " + action)
        return self._take()

    @staticmethod
    def acked_alert_id(target: str | None) -> int | None:
        """The alert id an "ack" request names (its target), or None for one that names none."""
        return int(target) if target and target.isdigit() else None

    def _take_ack(self, alert_id: str | None, ack) -> None:
        """`iowarden ack` wrote who and why on the alert's row and queued its id: the open alert takes them."""
        aid = self.acked_alert_id(alert_id)
        if aid is None or ack is None:
            return
        for a in self.open.values():
            if a.id == aid:
                a.acked_by, a.ack_note, a.acked_at = *ack, a.acked_at or time.time()
                self._changes.append(Said(logging.WARNING, "ALERT %s #%d acknowledged by %s: %s",
                                          (a.alert, a.id, a.acked_by, a.ack_note or "no note"),
                                          {"ALERT": a.alert, "TARGET": a.target}))

    def on_result(self, record: dict, identity: str, causes_fn, context: dict | None = None,
                  place: tuple = NOWHERE) -> list:
        """Judge one probe result; returns what changed. place: (mount point, devices) of its target, for the
        sentence of an alert it raises."""
        self._judge_result(record, identity, causes_fn, context, place)
        return self._take()

    def _judge_result(self, record, identity, causes_fn, context, place) -> None:
        target, profile = record["target"], record["profile"]
        # failures are the target's, whatever device it is on now (a vanished mount has none)
        fkey = (f"target:{target}", profile)
        if not record["ok"]:
            self.failures[fkey] = self.failures.get(fkey, 0) + 1
            akey = ("ProbeFailing",) + fkey
            if self.failures[fkey] >= FAILURES_BEFORE_ALERT and akey not in self.open:
                evidence = {"error": record["error"], "consecutive_failures": self.failures[fkey]}
                self._raise(akey, target, None, evidence, [record["error"] or "unknown error"], place)
            return
        self.failures[fkey] = 0
        if not stable_identity(self.pins.get(target)) and stable_identity(identity):
            self.pins[target] = identity
            self._changes.append(PinChanged(target, identity))
        if ("ProbeFailing",) + fkey in self.open:
            self._close(("ProbeFailing",) + fkey, "probe succeeded")
        on_slowed_host = slowed_host(context or {}) is not None
        if record["contended"] and not record.get("learned_under_load"):
            # measured under someone else's load: not learned, and not judged as the probe's own figures;
            # what the device delivered in total in those seconds is judged instead
            self._judge_contended(identity, profile, target, context or {}, causes_fn, place, on_slowed_host)
            return
        if record["contended"] and self._short_in_warmup(identity, profile, target, context or {}, causes_fn, place,
                                                         on_slowed_host):
            return
        self.last_short.discard((identity, profile))
        if identity in self.contended_strikes:   # a quiet probe ages the volume's count of short busy ones
            self.contended_strikes[identity] = contended.counted(self.contended_strikes[identity], None)
        if on_slowed_host and ("VolumeDegraded", identity, profile) not in self.open:
            return
        starved = starved_cpu(context or {})
        if starved and ("VolumeDegraded", identity, profile) not in self.open and self._worse_than_noise(
                identity, profile, record) and not (starved[1] is None and self._throughput_collapsed(
                    identity, profile, record)):
            # within what no rule of the detector counts it is learned and judged as ever: only figures the CPU
            # may have made are set aside. A device with no reading cannot say whether it shares them; there a
            # throughput fallen as far as a collapse is still the volume's (an idle volume's collapse pages on a
            # starved host), a latency or a smaller fall is not (the CPU's moved a 1 MiB read 2.6x)
            # a starved CPU lasts minutes and every profile meets it: said once a minute per probe, with a count
            # (the journal folds one template and its words; the figures may move)
            device = ("its device had no reading against its normal yet" if starved[1] is None else
                      "the device served its load at %.1fx its normal latency meanwhile")
            if self._throughput_collapsed(identity, profile, record):
                # set aside, yet a collapse's share of its normal is also what a cgroup limit set seconds before
                # gives (not yet in the host's view): the next probe, a minute later and not deferred long for the
                # busy device, is judged with the view then. A soak's quarter throttle met its first probe 4 s
                # in (51x under its normal, set aside on a starved CPU); the next ran 4 minutes later, behind
                # deferrals for the throttled device, and the page came at 330 s
                self.last_short.add((identity, profile))
            self._changes.append(Said(
                logging.INFO, "probe %s/%s out of its band not judged: tasks waited for a CPU %.0f %% of the time "
                "and " + device + ": measured on a starved CPU, not judged as the volume's own",
                (target, profile) + tuple(x for x in starved if x is not None),
                {"TARGET": target, "PROBE": profile, "REPEATS": True}))
            return
        akey = ("VolumeDegraded", identity, profile)
        verdicts = {}
        for metric, value in metrics_of(record).items():
            key = (identity, profile, metric)
            det = self.detectors.get(key)
            if det is None:
                det = self.detectors[key] = Detector(metric, self.params)
                self.learned_at[key] = time.time()
            v = det.update(value)
            if v.changed == "accepted":
                self.learned_at[key] = time.time()
                self._changes.append(Said(logging.WARNING, "new normal accepted for %s %s %s after a stable change",
                                          (identity, profile, metric), {"VOLUME": identity, "PROBE": profile}))
            verdicts[metric] = v
            self._changes.append(BaselineSaved(identity, profile, metric, self.learned_at[key], det.to_state()))
        self.latest[(identity, profile)] = verdicts
        # paged and re-sent only for a metric worse than its normal now, never for one back in band or better
        alerting = {m: v for m, v in verdicts.items() if v.alerting and v.z > 0 and not (
            m.endswith("_seconds") and v.baseline and v.value - v.baseline < LATENCY_FLOOR_SECONDS)}
        if set(alerting) <= TAIL_ONLY:
            alerting = {}
        if akey in self.open and not any(v.z > self.params.clear_z for v in alerting.values()):
            if any(v.alerting for v in verdicts.values()):
                return   # back in band: the detectors' hysteresis clears it, nothing is re-sent meanwhile
            alerting = {}
        if alerting and akey not in self.open and not any(
                v.changed == "raised" or v.z >= self.params.clear_z for v in alerting.values()):
            # the detectors are counting probes back in band (their hysteresis) on an alert closed by other
            # evidence (the busy device delivering its normal): a probe at its baseline is not a new page
            alerting = {}
        if alerting:
            # every metric past its band is said, not only those whose detector fired ("reason" says which did)
            moved = {m: v for m, v in verdicts.items() if v.z > 0 and (v.alerting or (
                not v.learning and v.baseline and v.z > MOVED_Z))}
            evidence = {"metrics": {m: {"value": v.value, "baseline": v.baseline, "z": round(v.z, 2),
                                        "reason": v.reason if v.alerting else None} for m, v in moved.items()},
                        "passive": context or {}}
            if akey not in self.open:
                causes = causes_fn(self.baseline_since(identity, profile))
                self._raise(akey, target, ",".join(sorted(alerting)), evidence, causes, place)
            else:
                # the figures and the causes of now: a limit or a neighbour seen since the raise is named too
                a = self.open[akey]
                a.metrics = evidence["metrics"]
                a.causes = tuple(causes_fn(self.baseline_since(identity, profile)))
                self._update(a, evidence, list(a.causes))
        elif akey in self.open:
            if "delivered_iops" in self.open[akey].metrics:
                # raised on a busy device's total: one quiet probe at its baseline is not yet the volume back. A
                # write lands in a cache above a limit (the week lane: the file under a loop device, at 400 IOPS)
                # and a quiet probe between two busy ones cleared it and the next raised it again (two pages)
                if not self._armed(identity, profile):
                    # raised in the warm-up: read against the normal its page quoted, not the normal so far, which
                    # learns the busy probes beside the fault; between short (a strike) and that normal a probe
                    # neither holds nor clears it
                    done = context.get("delivered_iops") if record["contended"] and context else \
                        record["read_iops"] + record["write_iops"]
                    quoted = self.open[akey].metrics["delivered_iops"].get("baseline") or 0.0
                    if done is None or done < quoted * contended.CONTENDED_RECOVERED:
                        return
                self.quiet_good[akey] = self.quiet_good.get(akey, 0) + 1
                if self.quiet_good[akey] < contended.QUIET_PROBES_TO_CLEAR_CONTENDED:
                    return
            self._close(akey, "back to its baseline")

    def _worse_than_noise(self, identity: str, profile: str, record: dict) -> bool:
        """Whether any of a probe's metrics is worse than its armed normal by what one of the detector's rules
        counts: more than its allowance k in spreads (the CUSUM adds it) or outside_ratio times (the outside and
        collapse rules read ratios, and on a volume whose p50 scatters widely a 12x p50 is under 2 spreads). Read
        from the detectors without changing them; a metric still learning says nothing."""
        p = self.params
        for metric, value in metrics_of(record).items():
            det = self.detectors.get((identity, profile, metric))
            spreads = det.spreads_from_normal(value) if det is not None else None
            if spreads is None:
                continue
            if spreads > p.k or spreads * det.baseline()[1] > math.log(p.outside_ratio):
                return True
        return False

    def _throughput_collapsed(self, identity: str, profile: str, record: dict) -> bool:
        """Whether the probe's IOPS or bandwidth fell to a collapse's share of its armed normal (the detector's
        collapse_ratio): what a starved CPU was not seen to do, where the device cannot be asked."""
        for metric, value in metrics_of(record).items():
            if not metric.endswith(("_iops", "_bw_bytes")):
                continue
            det = self.detectors.get((identity, profile, metric))
            base = det.baseline() if det is not None else None
            if base is not None and value * self.params.collapse_ratio <= math.exp(base[0]):
                return True
        return False

    def _armed(self, identity: str, profile: str) -> bool:
        """Whether the profile has a normal to judge against (a counted direction's detector armed)."""
        counted = (self.detectors.get((identity, profile, f"{d}_iops")) for d in ("read", "write"))
        return any(det is not None and det.baseline() is not None for det in counted)

    def _normal_so_far(self, identity: str, profile: str, at_least: int) -> dict | None:
        """The probe's IOPS and bytes a second (read and write summed), the median of what its detectors have
        learned, learning or not; None with fewer than `at_least` learned."""
        normal = {"iops": 0.0, "bw_bytes": 0.0}
        for d in ("read", "write"):   # the directions the profile does I/O in have detectors
            for kind in normal:
                det = self.detectors.get((identity, profile, f"{d}_{kind}"))
                if det is not None and len(det.values) >= at_least:
                    normal[kind] += math.exp(det.values.median())
        return normal if normal["iops"] > 0 and normal["bw_bytes"] > 0 else None

    def _short_in_warmup(self, identity, profile, target, context, causes_fn, place, on_slowed_host) -> bool:
        """A warm-up probe the scheduler would learn under load (its device busy probe after probe), set aside
        when the device's total in its seconds is short of what the warm-up's quiet probes got, the device's
        latency or a cgroup limit agreeing: the judgement an armed volume's busy probe gets (contended.py), read
        against the normal so far. A collapse in a volume's first minutes was learned as its normal (49 IOPS
        beside quiet warm-up probes of 60,000) and never paged. Not learned; the volume arms on later probes.
        It is a strike as an armed volume's is, and two page: a quarter throttle met in the warm-up (25 minutes
        after the start, tasks waiting for a CPU 98 % of the time, a quarter of the profiles still learning) gave
        four such probes in six minutes (319-354 IOPS in total against 1,959-5,978) and was never paged."""
        if self._armed(identity, profile):
            return False   # armed: its busy probes are judged by _judge_contended
        normal = self._normal_so_far(identity, profile, contended.WARMUP_QUIET_TO_READ)
        if normal is None or context.get("delivered_iops") is None \
                or context.get("delivered_bytes_per_second") is None:
            return False
        totals = contended.Totals(context["delivered_iops"], context["delivered_bytes_per_second"], normal["iops"],
                                  normal["bw_bytes"], context.get("probe_queue_depth"), None,
                                  context.get("delivered_on"), context.get("own_slowdown_now"),
                                  bool(context.get("cgroup_limited")), context.get("cpu_pressure_some_percent"),
                                  context.get("slowest_member_now"))
        short, strike = contended.short_and_agreed(totals)
        if not strike:
            if short:   # short with nothing agreeing ends a run of strikes, as on an armed volume
                self.contended_strikes.pop(identity, None)
            return False
        self._changes.append(Said(
            logging.WARNING, "probe %s/%s under load not learned: the busy device delivered %.0f IOPS in total where "
            "the probes its warm-up learned got %.0f, and %s: a volume short of its own speed is not a normal to learn",
            (target, profile, totals.delivered_iops, normal["iops"], contended.agreement_said(totals)),
            {"TARGET": target, "PROBE": profile, "REPEATS": True}))
        akey = ("VolumeDegraded", identity, profile)
        self.quiet_good.pop(akey, None)
        if on_slowed_host and akey not in self.open:
            return True   # the host's as much as the volume's: not counted, as an armed volume's busy probe there
        if not contended.agreed_on_a_reading(totals):
            # a window not read against its normal agrees for an armed volume on a free CPU; in a warm-up, on a
            # new daemon, the passive curves have learned nothing either, and it would agree with every busy probe
            return True
        before = self.contended_strikes.get(identity, contended.Strikes())
        v = contended.judge(totals, before.count, akey in self.open, None, self._paged_elsewhere(identity, profile),
                            learning=True)
        self.contended_strikes[identity] = contended.counted(before, v)
        self.last_short.add((identity, profile))   # the next probe soon, not deferred long for the busy device
        if v.action == "raise":
            self._raise_on_totals(akey, target, totals, v.said, causes_fn, context, place)
        return True

    def _paged_elsewhere(self, identity: str, profile: str) -> bool:
        """VolumeDegraded open on another profile of the volume: one fault, one page."""
        return any(k[0] == "VolumeDegraded" and k[1] == identity and k[2] != profile for k in self.open)

    def _raise_on_totals(self, akey, target, totals, said, causes_fn, context, place) -> None:
        figures = {"value": round(totals.delivered_iops, 1), "baseline": round(totals.normal_iops, 1),
                   "reason": "contended"}
        self._raise(akey, target, "delivered_iops", {"metrics": {"delivered_iops": figures}, "passive": context},
                    [said] + causes_fn(self.baseline_since(akey[1], akey[2])), place)

    def _judge_contended(self, identity, profile, target, context, causes_fn, place, on_slowed_host=False) -> None:
        """A probe on a busy disk, judged by the device's total against what the probe alone gets on the healthy
        volume (verdicts/contended.py); here its counts are kept and its verdict acted on.

        On a slowed host (its other disks at twice their normal latency or more, this one no slower than twice
        theirs) a short total is the host's as much as the volume's: it neither raises nor counts towards a
        raise, as a quiet probe there is not judged. A healthy volume under two WAL appenders and CPU pressure
        delivered 4,672 IOPS in total against the 4,775 a fifth of its normal asks, its device at 2.81x its
        normal beside neighbours at 2.68x, and paged; the twelve collapses and throttles of the soaks that raised
        here had their devices at 1.6-335x beside neighbours at 0.08-0.37x. An open alert is still cleared by it."""
        akey = ("VolumeDegraded", identity, profile)
        if on_slowed_host and akey not in self.open:
            return
        normal = {"iops": 0.0, "bw_bytes": 0.0}
        for d in ("read", "write"):
            for kind in normal:
                det = self.detectors.get((identity, profile, f"{d}_{kind}"))
                base = det.baseline() if det is not None else None
                normal[kind] += math.exp(base[0]) if base is not None else 0.0
        if context.get("delivered_iops") is None or context.get("delivered_bytes_per_second") is None \
                or not normal["iops"]:
            return
        key = (identity, profile)
        totals = contended.Totals(context["delivered_iops"], context["delivered_bytes_per_second"], normal["iops"],
                                  normal["bw_bytes"], context.get("probe_queue_depth"), context.get("passive_slowdown"),
                                  context.get("delivered_on"), context.get("own_slowdown_now"),
                                  bool(context.get("cgroup_limited")), context.get("cpu_pressure_some_percent"),
                                  context.get("slowest_member_now"))
        # strikes are the volume's, whichever profile met the busy disk: its profiles are probed in turn
        v = contended.judge(totals, self.contended_strikes.get(identity, contended.Strikes()).count,
                            akey in self.open, self.deep_short.get(identity), self._paged_elsewhere(identity, profile))
        self.contended_strikes[identity] = contended.counted(
            self.contended_strikes.get(identity, contended.Strikes()), v)
        (self.last_short.add if v.strike else self.last_short.discard)(key)
        if v.short:
            self.quiet_good.pop(akey, None)   # the quiet probes before it were the cache's, not the volume's
        if v.saturating:
            self.deep_short[identity] = v.held
        if v.action == "raise":
            self._raise_on_totals(akey, target, totals, v.said, causes_fn, context, place)
            return
        if v.action == "clear":
            self._close(akey, v.said)

    def on_passive(self, t, device: str, more_causes=(), device_facts: dict | None = None,
                   place: tuple = NOWHERE) -> list:
        """A passive verdict's transition (passive.Transition) as an alert on the device's volume; returns what
        changed. more_causes: what else is known of the device (its drive health), named after the verdict;
        device_facts: what the advice needs of it (verdicts/advice.py), kept with the alert for `status`;
        place: (mount point, devices) of the device, for the sentence."""
        self._judge_passive(t, device, more_causes, device_facts, place)
        return self._take()

    def _judge_passive(self, t, device, more_causes, device_facts, place) -> None:
        akey = (t.alert, t.device, PASSIVE_PROFILE)
        evidence = {"kind": t.kind, "device": device, **t.evidence}
        if device_facts is not None:
            evidence["device_facts"] = device_facts
        if t.state == "raised" and akey not in self.open:
            self._raise(akey, device, None, evidence, [t.summary, *more_causes], place)
            return
        if t.state == "updated" and akey in self.open:
            a = self.open[akey]
            self._update(a, evidence)
            self._changes.append(Said(logging.WARNING, "%s %s: %s", (t.alert, device, t.summary),
                                      {"ALERT": t.alert, "DEVICE": device}))
            return
        if t.state == "cleared" and akey in self.open:
            self._close(akey, t.summary)

    def passive_findings(self, devices: set[str]) -> list[str]:
        """What the passive detector holds open on these kernel devices: evidence for a probe alert's causes."""
        out = []
        for (alert, _, profile), a in self.open.items():
            if profile == PASSIVE_PROFILE and a.target in devices:
                out.extend(a.causes[:1])
        return out

    def target_dropped(self, target: str, why: str) -> list:
        """A discovered target is gone (unmounted): its probe failures are no longer news. Returns what changed."""
        for fkey in [k for k in self.failures if k[0] == f"target:{target}"]:
            del self.failures[fkey]
            if ("ProbeFailing",) + fkey in self.open:
                self._close(("ProbeFailing",) + fkey, why)
        return self._take()

    def _raise(self, akey, target, metric, evidence, causes, place) -> None:
        alert, identity, profile = akey
        severity = severity_of(alert)
        passive = profile == PASSIVE_PROFILE
        mount, devices = place
        evidence = {**evidence, "where": {"mountpoint": mount, "devices": list(devices)}}
        # the same sentence the page says (iowarden_alert_info), `status` prints and InfluxDB keeps
        text = alert_text(alert, None if passive else target, mount, tuple(devices), identity, profile,
                          evidence.get("metrics", {}), causes, max_chars=JOURNAL_TEXT_CHARS)
        aid, self.next_alert_id = self.next_alert_id, self.next_alert_id + 1
        raised_at = time.time()
        self.open[akey] = OpenAlert(aid, alert, severity, evidence.get("metrics", {}), target, raised_at,
                                    tuple(causes), mountpoint=mount, devices=tuple(devices))
        do = advice_of(alert, target, evidence["device_facts"], 0.0) if passive and evidence.get("device_facts") else ""
        self._changes.append(AlertRaised(aid, alert, identity, target, profile, metric, severity, evidence,
                                         tuple(causes), raised_at, text.sentence(), do))

    def _update(self, a: OpenAlert, evidence: dict, causes: list | None = None) -> None:
        """New figures for an open alert; where it was raised stays part of its record (the sentence's place)."""
        self._changes.append(AlertUpdated(a.id, a.severity, {**evidence, "where": {"mountpoint": a.mountpoint,
                                                                                  "devices": list(a.devices)}},
                                          None if causes is None else tuple(causes)))

    def _close(self, akey, why: str) -> None:
        a = self.open.pop(akey)
        self.quiet_good.pop(akey, None)
        # an episode's end ends its run of short busy probes: one more short one is a blip until the next agrees
        # (the week lane: a cleared alert raised again by a single busy probe while the host disk under every
        # volume was slow for a minute)
        self.contended_strikes.pop(akey[1], None)
        lasted = max(0.0, time.time() - a.raised_at)
        self._changes.append(AlertClosed(a.id, akey[0], akey[1], akey[2], a.target, a.severity, why, lasted))
