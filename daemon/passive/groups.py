"""The passive detector's group rules: a drive against its peers (the members of one array, the disks of
one model), the shift a whole group shares (a change of workload, not a sick drive), and a whole group
slow together. Mixed into PassiveDetector (detector.py), whose state they read: pure, no clock, no I/O."""
from __future__ import annotations

import itertools
import math
import statistics
from collections import deque

from iowarden.daemon.alert_kinds import severity_of
from iowarden.daemon.passive.peerstats import leave_one_out_medians
from iowarden.daemon.passive.values import ALERT_OF_KIND, DIRECTIONS, Transition, evidence_summary, median_of


# A member's verdict comes and goes by the window while its array is held to its pace (a deep probe loads every
# member at once and brings the slow one near its peers for a moment; the lab saw the array's DeviceSlow raised
# in such a gap): the array's own verdicts stay held this long after a member was last flagged.
MEMBER_HOLD_SECONDS = 600.0
# Loads within this of the peers' are alike: their latencies are compared as they are. Beyond it, a member's
# latency is compared with its peers' as its own curve moves it from their load to its own.
LOAD_ALIKE = 1.1
PEERS_NAMED = 8   # peers an alert names; a group of 1,024 disks is "and 1,015 more", not a 10 KB sentence


def named_peers(members, m: str) -> tuple[list[str], str]:
    """The first PEERS_NAMED of m's peers by name, and the text for the rest (" and N more" or "")."""
    others = [x for x in members if x != m]
    shown = sorted(others)[:PEERS_NAMED]
    return shown, (f" and {len(others) - len(shown)} more" if len(others) > len(shown) else "")


class GroupRules:
    def _held_back_by_members(self, out: list[Transition], stacks: dict, now: float | None) -> list[Transition]:
        """An array whose member is slow or at its limit is slow and at a ceiling too, but the member
        is the finding: an array of four held to one throttled member's pace is not at the array's
        limit. Its own self and saturation verdicts are held back while a member is flagged and for
        MEMBER_HOLD_SECONDS after (an open one clears, naming the member), so the page names the member,
        not the array."""
        for parent, members in stacks.items():
            culprits = sorted(m for m in members if m in self.devices and
                              {"peers", "saturation"} & set(self.devices[m].flagged))
            if culprits and now is not None:
                self.member_flagged[parent] = (now, culprits)
            elif not culprits and parent in self.member_flagged and now is not None and \
                    now - self.member_flagged[parent][0] < MEMBER_HOLD_SECONDS:
                culprits = self.member_flagged[parent][1]
            d = self.devices.get(parent)
            if not culprits or d is None:
                continue
            held = {"self", "saturation"}
            unseen = {t.kind for t in out if t.device == parent and t.kind in held and t.state == "raised"}
            out = [t for t in out if not (t.device == parent and t.kind in held)]
            for kind in sorted(held & set(d.flagged)):
                if kind in unseen:          # raised in this very batch: never shown, nothing to clear
                    d.flagged.pop(kind)
                    if kind == "saturation":
                        d.ceiling = None
                else:
                    out.append(self._clear(parent, d, kind, f"held back by its member {', '.join(culprits)}"))
        return out

    def _common_shift(self, groups) -> dict[str, float]:
        """Per device, how far its peers' latency moved off their own curves this past hour (log, >= 0).

        A workload change (more writes, larger requests: invisible in the load figure) moves every
        disk that carries it off its curve at once. A mild shift counts only beyond what the peers
        share; the acute rule and the peers' own comparison stay whole.
        """
        out = {}
        for group in groups:
            if len(group) >= 3:
                # with peers enough for a median, the peers' comparison judges mild shifts: it cancels a
                # workload change exactly, where subtracting the peers' shift from this one only roughly
                # does (on the Perseus traces healthy drives still wandered 1.4-1.7x for an hour)
                out.update({m: math.inf for m in group})
                continue
            meds = {m: self.devices[m].self_log.median() for m in group
                    if m in self.devices and len(self.devices[m].self_log) >= self.p.shift_min_windows}
            for m in group:
                others = [v for k, v in meds.items() if k != m]
                if others:
                    out[m] = max(0.0, statistics.median(others))
        return out

    def _common_now(self, groups) -> dict[str, float]:
        """Per member of a group of three or more, the group's median latency over the members' own normals in
        the last window (>= 1; _together_group keeps it): how far a change of workload moved the whole group
        (a median: one slow member does not move it). An acute window of one member counts beyond it, so
        drives that move together stay quiet (_together judges the group as a whole)."""
        out = {}
        for group in groups:
            common = self.group_common.get(tuple(group))
            if common is not None:
                out.update({m: common for m in group})
        return out

    def _judge_peers(self, group: tuple, members: list[str], evidence: dict) -> list[Transition]:
        out = []
        scores: dict[str, tuple[float, float]] = {}
        for direction in DIRECTIONS:
            flows = {m: evidence[m][direction] for m in members if direction in evidence[m]}
            units = {f.load()[0] for f in flows.values()}
            if len(flows) < 2 or len(units) != 1:
                continue
            loads = {m: f.load()[1] for m, f in flows.items()}
            peer_awaits = leave_one_out_medians({m: f.await_ms for m, f in flows.items()})
            peer_loads = leave_one_out_medians(loads)
            for m, f in flows.items():
                peer_await, peer_load = peer_awaits[m], peer_loads[m]
                if loads[m] > self.p.comparable_load * peer_load or peer_await <= 0:
                    continue   # more load than its peers explains more latency
                # what its peers' latency would be at its load: more load within the comparable range still
                # costs latency along the device's curve (a drive with a third more of the data than its peers)
                along = self._along_own_curve(m, direction, f.load()[0], loads[m], peer_load)
                if along is None:
                    continue   # more load than its peers, at a cost its curve has not learned yet
                peer_await *= along
                score = (math.log(max(f.await_ms, 1e-6) / peer_await), f.await_ms - peer_await, f.await_ms, peer_await)
                if m not in scores or score[0] > scores[m][0]:
                    scores[m] = score
        self.evidence.add(group, {m: score[0] for m, score in scores.items()})
        # a pair is two drives carrying traffic: a third member that is idle gives no median to judge by,
        # and the group rules' patience (severe_group_windows) would hold back the slow one of the two
        carrying = sum(1 for m in members if evidence[m])
        pair = min(len(group), carrying) < self.evidence.p.min_members
        log_severe = math.log(self.p.severe_ratio)
        for m, score in scores.items():
            d = self._dev(m)
            d.peer_log.add(score[0])
            d.peer_excess.add(score[1])
            d.peer_recent.append(score[:2])
            med_log, med_excess = d.peer_log.median(), d.peer_excess.median()
            n = self.p.severe_windows if pair else self.p.severe_group_windows
            recent = list(d.peer_recent)[-n:]
            severe = len(recent) >= n and sum(
                1 for lr, ex in recent if lr >= log_severe and ex >= self.p.floor_ms) >= self.p.raise_fraction * n
            # the last windows' median: a verdict is raised only while they are slow and cleared when they are in
            # line (peer_ratio above, peer_clear_ratio below: a band, so a member hovering between does not flap).
            # The whole run's median alone cleared a member named on its last windows two seconds later, its
            # slowdown too new to move it, and raised it again (the lab's flap); and held a mended one for an hour
            recent_log = median_of([r for r, _ in recent]) if recent else med_log
            persistent = pair and len(d.peer_log) >= self.p.peer_min_windows and \
                med_log >= math.log(self.p.peer_ratio) and med_excess >= self.p.floor_ms and \
                recent_log >= math.log(self.p.peer_ratio)
            named = not pair and self.evidence.named(m)
            if "peers" not in d.flagged and (severe or persistent or named):
                peers, more = named_peers(members, m)
                if named and not severe:
                    ev = self._evidence_ev(m, peers, med_excess, len(members) - 1)
                    summary = evidence_summary(m, ev, self.p.window_seconds * self.p.evidence_block_windows)
                else:
                    ev = {"ratio": round(math.exp(med_log if persistent else median_of([r for r, _ in recent])), 2),
                          "excess_ms": round(med_excess, 3), "peers": peers, "peers_total": len(members) - 1,
                          "windows": len(d.peer_log),
                          "rule": "persistent" if persistent else "severe"}
                    # the figures of this window beside the ratio of the whole run: what a person can check
                    ev.update(await_ms=round(score[2], 3), peers_await_ms=round(score[3], 3))
                    summary = (f"{m} is {ev['ratio']:.1f}x slower than its peers {', '.join(peers)}{more} at "
                               f"comparable load (median over {ev['windows']} windows; now await "
                               f"{score[2]:.2f} ms vs their {score[3]:.2f} ms)")
                out.append(self._raise(m, d, "peers", ev, summary))
            elif "peers" in d.flagged and not severe:
                rule = d.flagged["peers"].get("rule")
                e = self.evidence.members.get(m)
                if rule == "evidence" and (e is None or max(e.score, e.provisional) <= 0.0):
                    out.append(self._clear(m, d, "peers", "its evidence against its peers drained: in line for hours"))
                elif rule not in ("evidence", "tail") and not named and recent_log < math.log(self.p.peer_clear_ratio):
                    out.append(self._clear(m, d, "peers", "back in line with its peers"))
        return out

    def _along_own_curve(self, m: str, direction: str, unit: str, load: float, peer_load: float) -> float | None:
        """How many times the latency m's own curve gives at its load is of what it gives at its peers': 1 when
        it carries no more than LOAD_ALIKE times their load, None when it carries more and its curve has not
        learned both loads. Its own curve, not theirs: it is the one that has carried this load, and a ratio
        of its own latencies cancels its level, so a drive slow at every load is not excused by it."""
        if load <= LOAD_ALIKE * peer_load:
            return 1.0
        d = self.devices.get(m)
        curve = d.curves.get((direction, unit)) if d is not None else None
        if curve is None:
            return None
        mine = curve.median_along(load, self.p.bin_min_windows)
        theirs = curve.median_along(peer_load, self.p.bin_min_windows)
        return max(1.0, mine / theirs) if mine and theirs else None

    def _judge_tail(self, group: tuple, windows: list) -> list[Transition]:
        """A member whose p99.9 of real I/O left its peers' (passive/tail.py): raised as SlowMember, with the
        tail and the mean side by side, since the mean is what did not move."""
        tails = {w.device: w.tails for w in windows if w.tails}
        means = {w.device: {d: (f.await_ms, f.iops * w.seconds, (f.kib_per_second or 0.0) * w.seconds)
                            for d, f in w.flows.items() if f.iops}
                 for w in windows}
        judged = self.tail.add(group, tails, means)
        out = []
        for m, t in judged.items():
            d = self._dev(m)
            flagged = d.flagged.get("peers")
            if flagged is None and self.tail.named(m):
                peers, more = named_peers(group, m)
                ev = {"rule": "tail", "direction": t.direction, "tail_ms": round(t.tail_ms, 3),
                      "peers_tail_ms": round(t.peers_tail_ms, 3), "ratio": round(t.ratio, 2),
                      "mean_ratio": None if t.mean_ratio is None else round(t.mean_ratio, 2), "peers": peers,
                      "peers_total": len(group) - 1,
                      "blocks": t.out_streak, "block_seconds": round(self.p.window_seconds * self.tail.p.block_windows)}
                mean = "" if t.mean_ratio is None else f", while its mean is {t.mean_ratio:.2f}x theirs"
                summary = (f"{m} is slow on its tail: p99.9 {t.direction} {t.tail_ms:.1f} ms against "
                           f"{t.peers_tail_ms:.1f} ms of its peers {', '.join(peers)}{more}, in {t.out_streak} blocks of "
                           f"{ev['block_seconds']} s in a row{mean}: a few of its I/Os are very slow (a weak "
                           f"region, retries, a path that stalls)")
                out.append(self._raise(m, d, "peers", ev, summary))
            elif flagged is not None and flagged.get("rule") == "tail":
                why = self.tail.cleared(m)
                if why:
                    out.append(self._clear(m, d, "peers", why))
        return out

    def _evidence_ev(self, m: str, peers: list[str], excess_ms: float, peers_total: int | None = None) -> dict:
        e = self.evidence.members[m]
        g = next((g for key, g in self.evidence.groups.items() if m in key), None)
        open_windows = g.windows if g is not None and e.provisional > e.score else 0
        return {"ratio": round(e.ratio, 3), "excess_ms": round(excess_ms, 3), "peers": peers,
                "peers_total": peers_total if peers_total is not None else len(peers), "rule": "evidence",
                "score": round(max(e.score, e.provisional), 1),
                "open_minutes": round(open_windows * self.p.window_seconds / 60, 1),
                "threshold": self.evidence.p.threshold, "blocks_above": e.blocks_above,
                "blocks": e.blocks, "stray_ratio": round(math.exp(e.scale), 3), "windows": e.blocks}

    def _together(self, groups) -> list[Transition]:
        """Every member of a group slow against its own normal at once: the array, controller or host.

        A pair: both flagged slow on their own, said so. Three or more: the members' median acutely slow
        (self_ratio) in most of the last hour's windows raises every member as one finding, and clears when
        it is so in few; a change of workload that moves them together for less long raises nothing.
        """
        out = []
        for group in groups:
            ds = [self.devices.get(m) for m in group]
            if len(group) >= 3:
                out += self._together_group(tuple(group), ds)
            elif len(group) == 2 and all(d is not None and "self" in d.flagged for d in ds):
                for m, d in zip(group, ds):
                    ev = d.flagged["self"]
                    if not ev.get("together"):
                        ev["together"] = sorted(group)
                        out.append(Transition("self", m, "updated", severity_of(ALERT_OF_KIND["self"]),
                                              f"every member of {', '.join(sorted(group))} slowed together: the "
                                              "array, controller or host, not one member", dict(ev)))
        for key in set(self.group_slow) - {tuple(g) for g in groups}:
            del self.group_slow[key]
            self.group_common.pop(key, None)
        return out

    def _together_group(self, group: tuple, ds: list) -> list[Transition]:
        now = [d.window_ratio for d in ds if d is not None and d.window_ratio is not None]
        if len(now) * 2 < len(group):
            self.group_common.pop(group, None)   # too few judged to stand for the group
            return []
        ring = self.group_slow.setdefault(group, deque(maxlen=self.p.shift_windows))
        median = statistics.median(now)
        self.group_common[group] = max(1.0, median)
        ring.append(median >= self.p.self_ratio)
        slow = sum(ring)
        out = []
        # back: the last clear_run_windows all off the slow mark. Asked first: the hour's ring still holds three
        # quarters slow for most of an hour after the fault ends, and a raise asked first held the clear back so
        recovered = len(ring) >= self.p.clear_run_windows and not any(
            itertools.islice(reversed(ring), self.p.clear_run_windows))
        if not recovered and len(ring) == ring.maxlen and slow >= self.p.raise_fraction * len(ring):
            ratio = median
            for m, d in zip(group, ds):
                if d is not None and "self" not in d.flagged:
                    ev = {"rule": "together", "together": sorted(group), "ratio": round(ratio, 2),
                          "slow_windows": slow, "of_windows": len(ring)}
                    out.append(self._raise(m, d, "self", ev, (
                        f"every member of {', '.join(sorted(group))} slowed together, {ratio:.1f}x its own "
                        f"normal in {slow} of the last {len(ring)} windows: the array, controller or host, not "
                        "one member")))
        else:
            if slow <= self.p.clear_fraction * len(ring) or recovered:
                flagged = [(m, d) for m, d in zip(group, ds)
                           if d is not None and d.flagged.get("self", {}).get("rule") == "together"]
                for m, d in flagged:
                    out.append(self._clear(m, d, "self", "the group is back on its normal curves"))
                if flagged and recovered:
                    ring.clear()   # a new raise needs a whole ring of windows after the recovery
        return out

    # -- saturation ---------------------------------------------------------------------------
