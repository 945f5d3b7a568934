"""Passive detection: judge every disk from the traffic it already carries, at no I/O cost.

Fed windows of `iostat -x` figures (the daemon's sampler, or `replay --passive`),
it returns alert transitions of three kinds, each with the evidence behind it:

- self: the device is slower than its own normal *at the load it carries*
  (passive_curve.LatencyCurve). A load increase that moves latency along the
  curve is not a fault; the same latency at a lower load is. Raised when most
  of the last `self_windows` judged windows are slow, cleared when few are;
  nothing is learned while flagged.
- peers: a device slower than the devices that should behave alike (members of
  one md array or LVM stripe, else disks of one model and size), at comparable
  load. Scored per window as log latency over the peers' median. In a group of
  three or more, raised on evidence over time (passive/evidence.py): hour by
  hour, how far the drive sat above its peers in units of how far healthy
  drives of the same group stray, accumulated (a CUSUM) until it passes a
  threshold; so a drive at 1.2x for days is named, and a noisy healthy one that
  strays to 1.35x for an hour is not (the Perseus traces, bench/passive_perseus.py).
  In a pair, where no median says which one is normal, raised when the median of
  the last `peer_windows` scores reaches `peer_ratio`. In any group, at once when
  nearly every one of the last `severe_windows` is `severe_ratio` times its peers.
- saturation: a volume at its limit (a provisioned-IOPS or burst-credit cloud
  volume): throughput flat at a constant while the device stays busy with a
  queue, for `saturation_windows` windows. Named with the ceiling it sits at.
- contention: its users wait many times their usual while the device carries many times its usual load
  (passive/contention.py): other work floods a healthy device.

Pure: no clock, no I/O. Keys are whatever the caller uses for a device (the
daemon passes stable identities, replay the kernel names); learned curves go in
and out as JSON-able state.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections import deque

from iowarden.daemon.alert_kinds import severity_of
from iowarden.daemon.passive import burst, contention, host, service
from iowarden.daemon.passive.curve import (LOOK_UP_BINS, SATURATED_LOOK_UP_BINS, SATURATED_UTIL_PERCENT,
                                          LatencyCurve)
from iowarden.daemon.passive.evidence import PeerEvidence
from iowarden.daemon.passive.headroom import PeakLoad, headroom_ratio, knee_of
from iowarden.daemon.passive.tail import TailEvidence

from iowarden.daemon.passive.groups import GroupRules
from iowarden.daemon.passive.values import (ALERT_OF_KIND, FLEET_NORMAL_MIN_SECONDS, FLEET_OCTAVES,
                                            SUSPECT_WEIGHT, DeviceTrack, DeviceView, FleetNormal, PairRing,
                                            PassiveParams, RollingMedian, Transition, Window, median_of,
                                            self_summary)


class PassiveDetector(GroupRules):
    def __init__(self, params: PassiveParams = PassiveParams(), curves: dict | None = None,
                 record_blocks: bool = False):
        self.p = params
        self.devices: dict[str, DeviceTrack] = {}
        self.capability: dict[str, tuple] = {}   # device -> (IOPS, bytes/s) a characterisation measured
        self.evidence = PeerEvidence(params.evidence(), record_blocks)
        self.tail = TailEvidence(params.tail())
        self.group_slow: dict[tuple, deque] = {}   # group -> this past hour: was the members' median acutely slow
        self.group_common: dict[tuple, float] = {}  # group -> the members' median ratio to their normals, last window
        self.host_ratio: float | None = None        # the host's disks' median ratio to their normals (host.py)
        self.member_flagged: dict[str, tuple] = {}  # array -> (when a member was last flagged, which)
        self.neighbours_now: dict[str, float] = {}  # device -> its neighbours' median ratio, last windows
        self.contention = contention.ContentionRule(contention.ContentionParams.for_windows_of(params.window_seconds))
        self.services = service.ServiceRule(service.ServiceParams.for_windows_of(params.window_seconds,
                                                                                 params.service_learn_seconds))
        self.by_service: frozenset = frozenset()    # devices whose requests the tracer counts per cgroup
        self.burst_params = params.burst()
        for (device, direction, unit), st in (curves or {}).items():
            try:
                self._dev(device).curves[(direction, unit)] = LatencyCurve.from_state(st)
            except (KeyError, TypeError, ValueError, AttributeError):
                continue   # a damaged saved curve: this one is learned again, the rest load

    def _dev(self, device: str) -> DeviceTrack:
        d = self.devices.get(device)
        if d is None:
            d = self.devices[device] = DeviceTrack(self_ring=deque(maxlen=self.p.self_windows),
                                                   self_log=RollingMedian(self.p.shift_windows),
                                                   recent_log=deque(maxlen=self.p.clear_run_windows),
                                                   shift_seen=deque(maxlen=self.p.shift_history),
                                                   peer_log=RollingMedian(self.p.peer_windows),
                                                   peer_excess=RollingMedian(self.p.peer_windows),
                                                   peer_recent=PairRing(max(self.p.severe_windows,
                                                                            self.p.severe_group_windows)),
                                                   sat_ring=deque(maxlen=self.p.saturation_windows),
                                                   fleet_ring=deque(maxlen=max(1, round(self.p.fleet_seconds /
                                                                                        self.p.window_seconds))))
        return d

    # -- feeding ----------------------------------------------------------------------------
    def observe(self, windows: list[Window], groups: list[tuple[str, ...]] = (),
                stacks: dict[str, tuple[str, ...]] | None = None) -> list[Transition]:
        """Judge one batch of windows that end together; `groups` are sets of devices that are peers,
        `stacks` maps an md array or striped dm device to the members under it."""
        out = self._judge(windows, groups, stacks or {})
        return self._held_back_by_members(out, stacks or {}, max((w.end for w in windows), default=None))

    def _judge(self, windows: list[Window], groups, stacks: dict) -> list[Transition]:
        out: list[Transition] = []
        evidence = {w.device: {d: f for d, f in w.flows.items() if f.is_evidence(w.seconds, self.p)}
                    for w in windows}
        common = self._common_shift(groups)
        common_now = self._common_now(groups)
        # what the host's other disks share (host.py), from their last windows and their last hour
        related = host.related_by_stack(stacks)
        ratios = {w.device: r for w in windows if (r := self._ratio_now(w, evidence[w.device])) is not None}
        self.host_ratio = host.host_slowdown(ratios)
        host_now = host.neighbours_median(ratios, related)
        self.neighbours_now = host.neighbours_median(ratios, related, devices=self.devices)
        hours = {w.device: self.devices[w.device].self_log for w in windows if w.device in self.devices}
        host_shift = host.neighbours_median({m: log.median() for m, log in hours.items()
                                             if len(log) >= self.p.shift_min_windows}, related)
        for w in windows:
            now = max(common_now.get(w.device, 1.0), host_now.get(w.device, 1.0))
            # the hour's shift beyond the neighbours' hour, and beyond what they share this very window (their
            # hours turn a window apart: a host's slow hour is not one device's for the window between)
            shift = max(common.get(w.device, 0.0), host_shift.get(w.device, 0.0),
                        math.log(max(1.0, host_now.get(w.device, 1.0))))
            d = self._dev(w.device)
            # a direction whose requests are many times their usual size is judged on nobody's curve: its await
            # is mostly the big requests' own (a backup's 1 MiB reads among a database's 4 KiB ones)
            big = _big_requests(d, w, evidence[w.device], self.p.window_seconds)
            judged = {k: f for k, f in evidence[w.device].items() if k not in big}
            if w.device in self.by_service:
                # each service judged against its own normal (observe_services): a flood that hurts no one is
                # not paged, and one that hurts a service names it and its culprit
                out += [self._clear(w.device, d, "contention", "judged per service now")] \
                    if "contention" in d.flagged else []
            else:
                out += contention.transitions(self.contention, w, judged, d)
            # a device other work floods is slow along the flood's load, not its own: not DeviceSlow meanwhile
            flooded = "contention" in d.flagged or w.device in self.services.flagged
            out += self._judge_self(w, judged, shift, now) if not flooded else []
            out += self._judge_burst(w, d)
            out += self._judge_saturation(w, evidence[w.device])
        by_device = {w.device: w for w in windows}
        for group in groups:
            members = [m for m in group if m in by_device]
            if len(members) >= 2:
                out += self._judge_peers(tuple(group), members, evidence)
                out += self._judge_tail(tuple(group), [by_device[m] for m in members])
        self.evidence.forget_groups_but(tuple(g) for g in groups)
        self.tail.forget_groups_but(tuple(g) for g in groups)
        out += self._together(groups)
        if windows:
            now = max(w.end for w in windows)
            for name, d in self.devices.items():
                if d.flagged and d.last_traffic is not None and now - d.last_traffic > self.p.idle_clear_seconds:
                    for kind in list(d.flagged):
                        out.append(self._clear(name, d, kind, "no traffic to judge for an hour"))
        return out

    def observe_services(self, counts: dict, seconds: float, unix_time: float, words,
                         limited: frozenset[str] = frozenset()) -> list[Transition]:
        """The tracer's counts per cgroup since the last window: {device: {(cgroup, direction): CgroupCounts}} for
        every device it counts per cgroup (they are judged per service from now on, not by the device's rule for
        other work). words: how a cgroup is said. limited: the cgroups below the root with an I/O limit of their
        own, not judged as services."""
        self.by_service = frozenset(counts)
        out = []
        # a device raised but no longer counted (the tracer paused or gone) is judged idle: it clears in time
        for device in sorted(set(counts) | set(self.services.flagged)):
            out += self.services.judge(device, counts.get(device, {}), seconds, unix_time, words,
                                       self.neighbours_now.get(device), limited)
        return out

    def forget(self, device: str) -> list[Transition]:
        """A device that is gone: its open verdicts clear (its learned curves stay, for when it is back)."""
        d = self.devices.get(device)
        out = self.services.forget(device)
        if d is not None:
            out += [self._clear(device, d, kind, "the device is gone") for kind in list(d.flagged)]
            d.self_ring.clear(), d.self_log.clear(), d.recent_log.clear(), d.peer_log.clear(), d.peer_excess.clear()
            d.peer_recent.clear(), d.sat_ring.clear()
        self.tail.forget(device)
        return out

    # -- self ---------------------------------------------------------------------------------
    def _ratio_now(self, w: Window, flows: dict) -> float | None:
        """This window's worst latency over the device's normal at its load (None: nothing to judge it by)."""
        d, worst = self.devices.get(w.device), None
        for direction, f in flows.items():
            unit, load = f.load()
            curve = d.curves.get((direction, unit)) if d is not None else None
            normal = curve.normal_at(load, self.p.bin_min_windows) if curve is not None else None
            if normal is not None:
                worst = max(worst or 0.0, max(f.await_ms, 1e-6) / normal.median_ms)
        return worst

    def _judge_self(self, w: Window, flows: dict, common_shift: float = 0.0,
                    common_ratio: float = 1.0) -> list[Transition]:
        d = self._dev(w.device)
        d.window_ratio = None
        if not flows:
            return []
        d.last_traffic = w.end
        judged, slow_dirs, worst_log = False, {}, -math.inf
        # while the last hour runs high (not yet an alert), learn at a fraction of the weight: a real
        # shift must not become the normal before it is judged, a device that wanders still adapts
        weight = 1.0
        if len(d.self_log) >= self.p.shift_min_windows and d.self_log.median() >= math.log(self.p.shift_clear_ratio):
            weight = SUSPECT_WEIGHT
        flood = _flood_of(d, w, self.p.flood_bytes_ratio, self.p.window_seconds)
        reach = SATURATED_LOOK_UP_BINS if (w.util_percent or 0.0) >= SATURATED_UTIL_PERCENT else LOOK_UP_BINS
        for direction, f in flows.items():
            if flood is not None:
                # one direction carries many times its usual bytes (a backup's reads at full speed, a compaction's
                # writes): every direction of the device waits behind that work, and the window says nothing of
                # the device's own speed. Neither judged nor learned; the flood is the contention and service
                # rules' to judge (a backup's reads beside the database's writes in one cgroup put the writes at
                # 15-73x their normal, and DeviceSlow said "the device itself")
                continue
            unit, load = f.load()
            curve = d.curves.setdefault((direction, unit), LatencyCurve())
            peak = d.peaks.get((direction, unit))
            if peak is None:
                peak = d.peaks[(direction, unit)] = PeakLoad(self.p.peak_block_windows)
            peak.add(load)
            normal = curve.normal_at(load, self.p.bin_min_windows, reach)
            slow = False
            if normal is not None:
                judged = True
                ratio = max(f.await_ms, 1e-6) / normal.median_ms
                d.last_ratio[direction], d.last_expected[direction] = ratio, normal.median_ms
                excess = f.await_ms - normal.median_ms
                if excess >= self.p.floor_ms or ratio < 1:
                    worst_log = max(worst_log, math.log(ratio))
                slow = ratio >= self.p.self_ratio and f.await_ms >= normal.high_ms and excess >= self.p.floor_ms
                d.window_ratio = max(d.window_ratio or 0.0, ratio)
                if slow or ratio >= self.p.shift_ratio:
                    slow_dirs[direction] = (f, normal, ratio, unit, load)
            # an acutely slow window is never learned (it lies above the bin's p99 anyway, so its normal
            # is hardly biased), nor anything while the device is flagged slow
            if not slow and "self" not in d.flagged:
                curve.learn(load, f.await_ms, weight)
        if not judged:
            return []
        if d.window_ratio:
            d.fleet_ring.append(math.log(d.window_ratio))
        d.self_ring.append(any(r / common_ratio >= self.p.self_ratio for _, _, r, _, _ in slow_dirs.values()))
        if worst_log > -math.inf:
            d.self_log.add(worst_log)
        d.recent_log.append(max(worst_log, 0.0))   # no direction over its normal: the window is at it
        acute = len(d.self_ring) >= self.p.self_windows and \
            sum(d.self_ring) >= self.p.raise_fraction * self.p.self_windows
        d.self_count += 1
        shift = False
        if len(d.self_log) >= self.p.shift_min_windows:
            med = d.self_log.median() - common_shift    # -inf: the device's peers judge mild shifts
            limit = self._shift_limit(d)
            shift = limit is not None and med >= limit
            if d.self_count % self.p.shift_sample == 0 and "self" not in d.flagged and not shift \
                    and math.isfinite(med):
                d.shift_seen.append(med)
        if "self" not in d.flagged and (acute or shift) and slow_dirs:
            direction, (f, normal, ratio, unit, load) = max(slow_dirs.items(), key=lambda kv: kv[1][2])
            typical = math.exp(d.self_log.median()) if len(d.self_log) else ratio
            ev = {"direction": direction, "await_ms": round(f.await_ms, 3),
                  "expected_ms": round(normal.median_ms, 3), "ratio": round(ratio if acute else typical, 2),
                  "load": round(load, 1), "load_unit": "IOPS" if unit == "iops" else "KiB/s",
                  "rule": "acute" if acute else "shift",
                  "slow_windows": sum(d.self_ring) if acute else len(d.self_log),
                  "of_windows": len(d.self_ring) if acute else len(d.self_log)}
            return [self._raise(w.device, d, "self", ev, self_summary(w.device, ev))]
        rule = d.flagged.get("self", {}).get("rule")
        if rule in (None, "together"):
            return []
        limit = self._hour_clear_limit(d, rule)
        # the hour less what its peers share, as a shift is raised: a member of three or more is judged on
        # mild shifts by its peers (-inf here); the soak's whole group ran 2x its learned normal after the
        # throttle, its slow member back in line with the rest, and DeviceSlow stayed open
        emptied = sum(d.self_ring) <= self.p.clear_fraction * len(d.self_ring) and \
            (len(d.self_log) == 0 or d.self_log.median() - common_shift < limit)
        if emptied or self._recovered(d, common_shift, limit):
            if not emptied:
                # the fault's windows say nothing of the next one: it must be raised afresh, on windows after
                # the recovery (an acute raise needs a full ring again, a shift its hour)
                d.self_ring.clear(), d.self_log.clear()
            return [self._clear(w.device, d, "self", "latency back on its normal curve")]
        return []

    def _recovered(self, d: DeviceTrack, common_shift: float, limit: float) -> bool:
        """The last clear_run_windows judged windows all off the slow mark, their median back under the clear
        limit: the fault has ended, though the ring still holds its windows."""
        n = self.p.clear_run_windows
        if len(d.recent_log) < n or len(d.self_ring) < n:
            return False
        if any(itertools.islice(reversed(d.self_ring), n)):
            return False
        return statistics.median(d.recent_log) - common_shift < limit

    def _hour_clear_limit(self, d: DeviceTrack, rule: str) -> float:
        """How low the hour's median log ratio must be for a slow device to clear. Raised on the hour (a
        shift): below shift_clear_ratio, a margin under what raised it. Raised on the last ten minutes (acute):
        below what would raise a shift now, no lower. A busy week's host ran 1.2-1.4x its learned normal in
        health, and an acute alert held to 1.2x stayed open for the rest of the soak."""
        limit = self._shift_limit(d)
        if rule == "acute":
            return limit if limit is not None else math.log(self.p.shift_ratio)
        return math.log(self.p.shift_clear_ratio) + max(0.0, (limit or 0.0) - math.log(self.p.shift_ratio))

    def _shift_limit(self, d: DeviceTrack) -> float | None:
        """How high the hour's median log ratio may go: shift_ratio, or more on a device whose hourly
        medians wander more than that in health (real drives do, day to day: the Perseus traces). None
        until enough hours are seen to know."""
        if len(d.shift_seen) < 8:
            return None
        seen = sorted(d.shift_seen)
        wander = seen[min(len(seen) - 1, int(0.9 * len(seen)))]
        return max(math.log(self.p.shift_ratio), wander + math.log(self.p.shift_margin))

    # -- peers --------------------------------------------------------------------------------
    def _judge_saturation(self, w: Window, flows: dict) -> list[Transition]:
        d = self._dev(w.device)
        d.last_total = (sum(f.iops or 0.0 for f in w.flows.values()),
                        sum(f.kib_per_second or 0.0 for f in w.flows.values()) * 1024)
        mix = _mostly(w.flows)
        _note_best(d, *d.last_total, w.util_percent, mix)
        if w.own_probe:
            # iowarden's own fio at a fixed queue depth is flat by itself: such a window shows what the
            # device delivers (its best, above), not a ceiling, and neither starts nor ends one
            return []
        if not flows or w.util_percent is None or w.queue_size is None:
            d.sat_ring.append(None)
        else:
            iops = sum(f.iops for f in w.flows.values() if f.iops is not None)
            kib = sum(f.kib_per_second for f in w.flows.values() if f.kib_per_second is not None)
            worst = max(f.await_ms for f in flows.values())
            d.sat_ring.append((iops, kib, w.queue_size, w.util_percent, worst))
        held = d.flagged.get("saturation")
        if held is not None and flows:
            # a volume held at a limit never delivers past it (it dips below when its demand does); a busy one
            # whose throughput only looked flat for a few windows (a database at its daily peak, 10 % noise)
            # scatters above it within minutes, and a raise left open while it was merely busy lasted the peak
            idx = 0 if held["ceiling_unit"] == "IOPS" else 1
            recent = [s[idx] for s in d.sat_ring if s is not None][-self.p.saturation_windows:]
            mean = statistics.fmean(recent) if recent else 0.0
            spread = statistics.pstdev(recent) / mean if mean > 0 and len(recent) >= 2 else 0.0
            above = max(recent, default=0.0) > held["ceiling"] * (1 + self.p.saturation_cv)
            if recent and (recent[-1] > held["ceiling"] * SATURATION_ESCAPE
                           or (len(recent) == self.p.saturation_windows and spread > 2 * self.p.saturation_cv
                               and above)):
                return [self._clear(w.device, d, "saturation", f"its throughput moved ({spread:.0%} window to "
                                    f"window, {recent[-1] / held['ceiling']:.2f}x the ceiling now): not held")]
        busy = [s for s in d.sat_ring if s is not None and s[3] >= self.p.saturation_util_percent
                and s[2] >= self.p.saturation_queue]
        if len(busy) == self.p.saturation_windows:
            cost = self._queue_cost_ms(d)
            busy = [s for s in busy if s[4] >= cost]
        ceiling = None
        if len(busy) == self.p.saturation_windows:
            for idx, unit in ((0, "IOPS"), (1, "KiB/s")):
                values = [s[idx] for s in busy]
                mean = statistics.fmean(values)
                if mean > 0 and statistics.pstdev(values) / mean <= self.p.saturation_cv:
                    ceiling = (mean, unit)
                    break
        cap_iops, cap_bw = self.capability.get(w.device, (None, None))
        if ceiling is not None and "saturation" not in d.flagged:
            value, unit = ceiling
            measured = cap_iops if unit == "IOPS" else (cap_bw / 1024 if cap_bw else None)
            # what it has shown it can do at this request size: characterized, or its best in a window this run
            size = (mix, _size_bucket(statistics.fmean(s[0] for s in busy), statistics.fmean(s[1] for s in busy) * 1024))
            shown = d.best.get(size, (0.0, 0.0))
            best = max(measured or 0.0, shown[0] if unit == "IOPS" else shown[1] / 1024)
            if unit == "IOPS" and d.burst is not None and d.burst.bucket is not None:
                # a bucket's burst rate is what it has shown, whatever its util then (a candidate's is not yet:
                # a backup's reads, then a compaction's writes, is two jobs)
                best = max(best, d.burst.bucket.burst_iops)
            if value >= self.p.saturation_below_best * best:
                return []   # at its own best: busy at full speed, not held below what it can do
            shown = f"{value:,.0f} IOPS" if unit == "IOPS" else f"{value / 1024:,.1f} MiB/s"
            d.ceiling = shown
            said = f"{best:,.0f} IOPS" if unit == "IOPS" else f"{best / 1024:,.1f} MiB/s"
            shown += (f" (its characterized saturation: {said})" if measured and best == measured else
                      f" ({value / best:.0%} of the {said} it has delivered)")
            spent = burst.fall_clause(d.burst, value) if unit == "IOPS" else None
            shown += f", {spent}" if spent else ""
            ev = {"ceiling": round(value, 1), "ceiling_unit": unit, "characterized": measured, "best": round(best, 1),
                  "queue": round(statistics.fmean(s[2] for s in busy), 1),
                  "await_ms": round(statistics.fmean(s[4] for s in busy), 2),
                  "util_percent": round(statistics.fmean(s[3] for s in busy), 1)}
            return [self._raise(w.device, d, "saturation", ev,
                                f"{w.device} is at its limit: {shown}, queue {ev['queue']:g}, "
                                f"await {ev['await_ms']:g} ms")]
        if "saturation" in d.flagged and len(busy) <= self.p.saturation_windows // 2:
            d.ceiling = None
            return [self._clear(w.device, d, "saturation", "no longer held at a ceiling")]
        return []

    # -- burst credits ---------------------------------------------------------------------------
    def set_bucket(self, device: str, burst_iops: float, baseline_iops: float, capacity_ios: float) -> None:
        """A bucket the config gives for the device: used from the start, in place of any learned one."""
        d = self._dev(device)
        b = d.burst.bucket if d.burst is not None else None
        if b is None or (b.source, b.burst_iops, b.baseline_iops, b.capacity_ios) != (
                "configured", burst_iops, baseline_iops, capacity_ios):
            d.burst = burst.configured(burst_iops, baseline_iops, capacity_ios)

    def load_burst(self, device: str, st: dict, now: float) -> None:
        """A bucket saved at the last stop (burst.from_state: its balance refilled for the time down)."""
        d = self._dev(device)
        d.burst = burst.from_state(st, now, into=d.burst)

    def bursts_state(self, now: float) -> dict:
        """device -> the JSON-able bucket and balance, where one is known or a candidate."""
        return {name: st for name, d in self.devices.items()
                if d.burst is not None and (st := burst.to_state(d.burst, now)) is not None}

    def _judge_burst(self, w: Window, d: DeviceTrack) -> list[Transition]:
        """The device's bucket, learned from its falls and recoveries or configured, and its credits' time left
        at the current draw (passive/burst.py). Every window counts, iowarden's own probes too: they spend credits."""
        if d.burst is None:
            d.burst = burst.learning()
        iops = sum(f.iops or 0.0 for f in w.flows.values())
        busy = ((w.util_percent or 0.0) >= self.p.saturation_util_percent
                and (w.queue_size or 0.0) >= self.p.saturation_queue)
        shape = (_mostly(w.flows), _size_bucket(iops, sum(f.kib_per_second or 0.0 for f in w.flows.values()) * 1024))
        out = []
        for state, summary, ev in burst.step(d.burst, self.burst_params, w.device, w.end, w.seconds, iops, busy,
                                             shape):
            if state == "raised":
                out.append(self._raise(w.device, d, "burst", ev, summary))
            elif "burst" in d.flagged:
                out.append(self._clear(w.device, d, "burst", summary.split(": ", 1)[-1]))
        return out

    def _queue_cost_ms(self, d: DeviceTrack) -> float:
        """A queue that costs latency: twice the device's unqueued normal, where it has learned one."""
        normals = [c.lowest_load_normal(self.p.bin_min_windows) for c in d.curves.values()]
        known = [n.median_ms for n in normals if n is not None]
        return self.p.self_ratio * min(known) if known else 0.0

    # -- transitions and views ----------------------------------------------------------------
    def _raise(self, device, d, kind, ev, summary) -> Transition:
        ev = {**ev, "summary": summary}
        d.flagged[kind] = ev
        return Transition(kind, device, "raised", severity_of(ALERT_OF_KIND[kind]), summary, dict(ev))

    def _clear(self, device, d, kind, why) -> Transition:
        ev = d.flagged.pop(kind)
        if kind == "saturation":
            d.ceiling = None
        if kind == "burst" and d.burst is not None:   # cleared from outside the bucket's own verdict (gone, idle)
            d.burst.raised, d.burst.low_windows = False, 0
        return Transition(kind, device, "cleared", severity_of(ALERT_OF_KIND[kind]), f"{device}: {why}", ev)

    def views(self) -> tuple[DeviceView, ...]:
        out = []
        for name, d in sorted(self.devices.items()):
            # the recent windows' median: what a dashboard should show while a member is slow now
            peer = math.exp(median_of([lr for lr, _ in d.peer_recent])) if d.peer_recent else None
            learned = {}
            for (direction, _unit), c in d.curves.items():
                learned[direction] = learned.get(direction, 0) + c.windows()
            cap = self.capability.get(name, (None, None))
            ratio = {}
            if cap[0]:
                ratio["iops"] = d.last_total[0] / cap[0]
            if cap[1]:
                ratio["bandwidth"] = d.last_total[1] / cap[1]
            e = self.evidence.members.get(name)
            t = self.tail.members.get(name)
            knees, headroom = self._headroom(d)
            out.append(DeviceView(name, dict(d.last_ratio), dict(d.last_expected), learned, peer, d.ceiling,
                                  tuple(sorted(set(d.flagged) | ({"service"} if name in self.services.flagged
                                                                  else set()))), cap, ratio, dataclasses.replace(e) if e else None,
                                  self.evidence.p.threshold if e else None, self.p.self_ratio,
                                  dataclasses.replace(t) if t is not None and t.tail_ms is not None else None,
                                  self.neighbours_now.get(name), knees, headroom,
                                  d.burst.forecast if d.burst is not None else None,
                                  math.exp(median_of(list(d.fleet_ring))) if d.fleet_ring else None,
                                  self.services.views(name), self._fleet_normal(d), d.window_ratio))
        return tuple(out)

    def fleet_normal(self, name: str) -> tuple[FleetNormal, ...]:
        """One device's fleet level (its view's fleet_normal) without the rest of its view."""
        d = self.devices.get(name)
        return self._fleet_normal(d) if d is not None else ()

    def _fleet_normal(self, d: DeviceTrack) -> tuple[FleetNormal, ...]:
        """Each direction's own normal by octave of load, from its busier curve (by IOPS or by bytes)."""
        out, done = [], set()
        min_windows = max(1, round(FLEET_NORMAL_MIN_SECONDS / self.p.window_seconds))
        for (direction, unit), c in sorted(d.curves.items(), key=lambda kv: -kv[1].windows()):
            if direction in done:
                continue
            done.add(direction)
            out += [FleetNormal(direction, unit, k, median_ms, windows)
                    for k, (median_ms, windows) in c.octave_medians(min_windows, FLEET_OCTAVES).items()]
        return tuple(out)

    def _headroom(self, d: DeviceTrack) -> tuple[dict, dict]:
        """Each direction's knee (the busier curve where a direction has one by IOPS and one by bytes) and the
        headroom of its recent peak against it."""
        knees, headroom = {}, {}
        for (direction, unit), c in sorted(d.curves.items(), key=lambda kv: -kv[1].windows()):
            if direction in knees:
                continue
            k = knee_of(c, unit, self.p.bin_min_windows, self.p.knee_multiple)
            knees[direction] = k
            peak = d.peaks.get((direction, unit))
            ratio = headroom_ratio(k, peak.peak() if peak is not None else None)
            if ratio is not None:
                headroom[direction] = ratio
        return knees, headroom

    def curves_state(self) -> dict:
        """(device, direction, unit) -> JSON-able curve, for the state database."""
        return {(name, direction, unit): c.to_state()
                for name, d in self.devices.items() for (direction, unit), c in d.curves.items() if c.bins}


BEST_MIN_UTIL_PERCENT = 15.0   # below this a window's rate scaled to full util is mostly noise
# a window past this many times the ceiling a volume was held at ends the hold: a limit's windows scatter within
# saturation_cv (5 %) of it, so three times that above it is not held
SATURATION_ESCAPE = 1.15


def _size_bucket(iops: float, bytes_per_second: float) -> int:
    """Request sizes by powers of two (4 KiB, 8 KiB, ... 1 MiB): IOPS compare only at one size."""
    return round(math.log2(max(bytes_per_second / iops, 512.0))) if iops > 0 else 0


def _mostly(flows: dict) -> str:
    """The direction that moved most of a window's bytes: 1 MiB writes and 1 MiB reads are not one speed
    (a compaction's writes compared with a backup's reads looked like a ceiling at 26 % of the best)."""
    read = (flows["read"].kib_per_second or 0.0) if "read" in flows else 0.0
    written = sum(f.kib_per_second or 0.0 for k, f in flows.items() if k != "read")
    return "read" if read >= written else "write"


def _flood_of(d: DeviceTrack, w: Window, ratio: float, window_seconds: float) -> str | None:
    """The direction carrying at least `ratio` times its usual bytes a second in this window (and a mebibyte a
    second or more), once its usual is known (FLOOD_LEARN_SECONDS of windows); None otherwise. The usual is learned
    here from the windows that are neither a flood nor iowarden's own probe: a slow average of each direction's log
    bytes a second over about FLOOD_MEMORY_SECONDS."""
    learn_windows = max(4, round(FLOOD_LEARN_SECONDS / window_seconds))
    memory_windows = max(learn_windows, round(FLOOD_MEMORY_SECONDS / window_seconds))
    flood = None
    for direction, f in w.flows.items():
        kib = f.kib_per_second or 0.0
        usual = d.usual_log_kib.get(direction)
        if usual is not None and usual[1] >= learn_windows and kib >= FLOOD_MIN_KIB_PER_SECOND and \
                kib >= ratio * math.exp(usual[0]):
            flood = direction if flood is None or kib > (w.flows[flood].kib_per_second or 0.0) else flood
    if flood is None and not w.own_probe:
        for direction, f in w.flows.items():
            log_kib = math.log(max(f.kib_per_second or 0.0, 1.0))
            mean, n = d.usual_log_kib.get(direction, (log_kib, 0))
            n = min(n + 1, memory_windows)
            d.usual_log_kib[direction] = (mean + (log_kib - mean) / n, n)
    return flood


def _big_requests(d: DeviceTrack, w: Window, flows: dict, window_seconds: float) -> frozenset:
    """The directions whose requests in this window average at least BIG_REQUEST_RATIO times their usual size, once
    it is known (FLOOD_LEARN_SECONDS of windows). Latency at a load in IOPS compares only at one request size: 13
    writes a second of 1 MiB are not 13 of 4 KiB, and a curve that learned the small ones calls the big ones tens
    of times slow on a healthy device. The usual is a slow average of the log size over every window but
    iowarden's own probes, big ones too: a workload that moves to bigger requests for good is judged again within
    hours, and ten minutes of 1 MiB requests among six hours of 4 KiB ones move it by a sixth."""
    learn_windows = max(4, round(FLOOD_LEARN_SECONDS / window_seconds))
    memory_windows = max(learn_windows, round(FLOOD_MEMORY_SECONDS / window_seconds))
    big = set()
    for direction, f in flows.items():
        if not f.iops or f.kib_per_second is None:
            continue
        log_size = math.log(max(f.kib_per_second / f.iops, 0.5))
        usual = d.usual_log_size.get(direction)
        if usual is not None and usual[1] >= learn_windows and log_size >= usual[0] + math.log(BIG_REQUEST_RATIO):
            big.add(direction)
        if not w.own_probe:
            mean, n = usual if usual is not None else (log_size, 0)
            n = min(n + 1, memory_windows)
            d.usual_log_size[direction] = (mean + (log_size - mean) / n, n)
    return frozenset(big)


# requests this many times their usual size: a backup's 1 MiB reads among a database's 4-16 KiB ones are 64-256x
BIG_REQUEST_RATIO = 4.0
# a direction's usual bytes a second: known after five minutes of windows, averaged over about six hours; a flood
# is at least a mebibyte a second (a direction that idles at kilobytes is not flooded by a few more)
FLOOD_LEARN_SECONDS = 300.0
FLOOD_MEMORY_SECONDS = 21600.0
FLOOD_MIN_KIB_PER_SECOND = 1024.0


def _note_best(d: DeviceTrack, iops: float, bytes_per_second: float, util_percent: float | None,
               mix: str = "read") -> None:
    """The most the device has shown it can do at each request size and direction: a window's rate scaled
    to full util. A probe that ran for one second of a five-second window at 50,000 IOPS shows 50,000, not
    its 10,000 average; a backup at 1 MiB shows what 1 MiB reads get, and is compared with that alone."""
    if iops <= 0 or util_percent is None or util_percent < BEST_MIN_UTIL_PERCENT:
        return
    scale = 100.0 / min(util_percent, 100.0)
    size = (mix, _size_bucket(iops, bytes_per_second))
    old = d.best.get(size, (0.0, 0.0))
    d.best[size] = (max(old[0], iops * scale), max(old[1], bytes_per_second * scale))
