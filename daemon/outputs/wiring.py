"""The outputs: the Prometheus endpoint over snapshots, and InfluxDB points with their spool.

Both consume what the daemon already holds and trigger no probe; the one read of the machine is
/proc/diskstats at each scrape, so the disk counters are current at the scrape's timestamp.
"""
from __future__ import annotations

import logging
import os
import time

from iowarden.probes.blockqueue import identity_of
from iowarden.probes import diskstats
from iowarden.probes.vocabulary import MEASURED_METRICS

from iowarden.daemon.events import InfluxCounted, frozen_map
from iowarden.daemon.outputs import influx, line_protocol

log = logging.getLogger("iowarden")


def start_prometheus(cfg: dict, core, roots):
    """cfg: the [prometheus] section; core: its snapshot is what is rendered, once per version;
    roots: where /proc is (the disk counters are read at each scrape)."""
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

    from iowarden.daemon.outputs.http import serve
    from iowarden.daemon.outputs.web_config import WebConfig, load_web_config
    from iowarden.daemon.outputs.prometheus import SnapshotCollector
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(SnapshotCollector(lambda: core.snapshot, read_disk_sample=lambda: diskstats.read(roots),
                                        runbook_url=cfg.runbook_url))
    web = load_web_config(cfg.web_config_file) if cfg.web_config_file else WebConfig()
    server = serve(cfg.listen_address, registry, web, version_of_snapshot=lambda: core.published)
    log.info("serving metrics on %s%s%s", cfg.listen_address, " with TLS" if web.tls else "",
             " and basic auth" if web.users else "")
    return server


def watch_endpoint(server, restart, timeout_seconds: float):
    """The step of the part that watches /metrics: (the server serving now, None), or, when it was down and
    has been started again, (the new server, what was wrong). A restart that fails raises (the next step
    tries again); the part counts it either way, and the registry's stats and the log say so."""
    from iowarden.daemon.outputs.http_wire import check_server
    try:
        check_server(server, timeout_seconds)
        return server, None
    except RuntimeError as exc:
        problem = f"the metrics endpoint was down ({exc}); started again"
    try:
        server.shutdown()
    except Exception:   # noqa: BLE001 - what is left of it must not keep the new one from starting
        log.exception("stopping what was left of the metrics endpoint failed")
    return restart(), problem


def _security(web) -> str:
    users = len(web.users)
    return (("TLS" if web.tls else "no TLS") + ", " +
            (f"basic auth for {users} user{'s' if users != 1 else ''}" if users else "no basic auth"))


def endpoint_change(before, after) -> str:
    """What a reload did to the endpoint's security, said as a change only where there is one: an unchanged
    file is "kept as it was", not a "now without TLS" that reads like a downgrade."""
    if before is None:
        return f"serving with {_security(after)}"
    was, now = _security(before), _security(after)
    if was == now and before.users == after.users:
        return f"kept as it was ({now}; the web config read again)"
    if was == now:
        return f"{now}, the users' passwords or names changed"
    return f"was {was}, now {now}"


def reload_prometheus(server, old: dict, new: dict, core, roots):
    """Apply a reloaded [prometheus] section, or refuse it whole: (the endpoint serving now, None), or (the
    endpoint as it was, why the new section was refused). The web-config file is read again either way:
    a reload is how new users, hashes or certificates are taken. The same address keeps its socket and
    takes the new TLS and auth for what it accepts and reads from now on; a new address is bound first,
    and only then is the old one closed, so a port that cannot be had leaves the old endpoint as it was."""
    from iowarden.daemon.outputs.web_config import WebConfig, WebConfigError, load_web_config
    if not new.enabled:
        if server is not None:
            server.shutdown()
            log.info("metrics endpoint on %s closed: [prometheus] enabled = false", old.listen_address)
        return None, None
    try:
        web = load_web_config(new.web_config_file) if new.web_config_file else WebConfig()
    except WebConfigError as exc:
        return server, f"the web config cannot be used ({exc})"
    if server is not None and old.enabled and new.listen_address == old.listen_address:
        before = getattr(server, "web", None)
        try:
            server.reconfigure(web)
        except OSError as exc:
            return server, str(exc)
        log.info("metrics endpoint on %s: %s", new.listen_address, endpoint_change(before, web))
        return server, None
    try:
        fresh = start_prometheus(new, core, roots)
    except (OSError, WebConfigError) as exc:
        return server, f"cannot serve on {new.listen_address} ({exc})"
    if server is not None:
        server.shutdown()
        log.info("metrics endpoint on %s closed: it moved to %s", old.listen_address, new.listen_address)
    return fresh, None


class InfluxOutput:
    """Points for InfluxDB from probe results, events and iostat summaries; flushed as a registry part."""

    def __init__(self, c: dict, spool_dir: str, get_snapshot, post=None):
        """c: the [influxdb] section; spool_dir: the spool, a directory of the daemon's own (StateDir.subdir);
        get_snapshot: the core's latest snapshot (the iostat summaries' source); post: the core's, for the
        writer's counters (InfluxCounted) after a flush that moved them."""
        self.get_snapshot, self.post = get_snapshot, post
        self._counters_posted: dict | None = None
        self.iostat_interval = c.iostat_interval_seconds
        self.writer = influx.InfluxWriter(
            c.url, c.org, c.bucket, influx.read_token(c.token_file, c.token_env),
            spool_dir, c.spool_max_bytes,
            c.timeout_seconds)
        self.host = self.writer.host
        self._iostat_prev: diskstats.DiskSample | None = None
        self._iostat_at = 0.0
        # the last of the core's numbered Told taken (snapshot.told): made once at start, before the core, so
        # everything the core tells is taken from its first number
        self._told_taken = 0

    def take_told(self) -> None:
        """Points for what the core told since the last take: probe results, alert and drift events. Numbers
        skipped (more told between two takes than a snapshot keeps) are points dropped, and counted so."""
        snap = self.get_snapshot()
        fresh = [t for t in (snap.told if snap is not None else ()) if t.seq > self._told_taken]
        if not fresh:
            return
        if fresh[0].seq > self._told_taken + 1 and self._told_taken:
            self.writer.points_dropped_total += fresh[0].seq - self._told_taken - 1
        for t in fresh:
            if t.what == "probe":
                self.probe_result(t.fields["record"], t.fields["identity"])
            elif t.what == "event":
                self.event(unix_time=t.unix_time, **t.fields)
        self._told_taken = fresh[-1].seq

    def probe_result(self, record: dict, identity: str) -> None:
        tags = {"host": self.host, "target": record["target"], "profile": record["profile"],
                "device": record["device"], "volume": identity}
        # a failed probe's figures (e.g. the partial report of a fio killed at shutdown) are
        # not a measurement of the volume: its point says ok=false and why, as /metrics does
        fields = {k: record[k] for k in MEASURED_METRICS} if record["ok"] else {}
        fields["duration_seconds"] = record["duration_seconds"]
        fields.update(ok=bool(record["ok"]), contended=bool(record["contended"]))
        if record["error"]:
            fields["error"] = record["error"]
        self.writer.add([line_protocol.line("iowarden_probe", tags, fields, record["started_at"])])

    def event(self, kind: str, unix_time: float | None = None, **data) -> None:
        tags = {"host": self.host, "kind": kind}
        for k in ("device", "volume", "target", "profile", "alert", "setting", "severity"):
            if data.get(k):
                tags[k] = data.pop(k)
        self.writer.add([line_protocol.line("iowarden_event", tags, {k: str(v) for k, v in data.items()},
                                            time.time() if unix_time is None else unix_time)])

    def step(self) -> None:
        self.take_told()
        now = time.monotonic()
        snap = self.get_snapshot()
        cur = snap.disk_sample if snap is not None else None
        if cur is not None and now - self._iostat_at >= self.iostat_interval:
            # the same sample twice (the daemon was stopped, or the sampler fell behind): no interval, no rates
            if self._iostat_prev is not None and cur.monotonic_seconds > self._iostat_prev.monotonic_seconds:
                lines = []
                for name, r in diskstats.rates_between(self._iostat_prev, cur).items():
                    if name not in snap.disk_rates:
                        continue  # only what the sampler watches (whole devices by default)
                    tags = {"host": self.host, "device": name, "volume": identity_of(name, snap.devices)}
                    lines.append(line_protocol.line("iowarden_disk", tags, {k.replace("/", "_per_").replace("-", "_"):
                                                                     float(v) for k, v in r.as_sysstat().items()
                                                                     if k != "disk_device"}, time.time()))
                self.writer.add(lines)
            self._iostat_prev, self._iostat_at = cur, now
        self.writer.flush()
        counters = self.counters()
        if counters != self._counters_posted and self.post is not None:
            self._counters_posted = counters
            self.post(InfluxCounted(frozen_map(counters)))

    def counters(self) -> dict:
        """The writer's counters, as iowarden_influxdb_* exports them."""
        w = self.writer
        return {"written": w.points_written_total, "spooled": w.points_spooled_total,
                "dropped": w.points_dropped_total, "errors": w.write_errors_total,
                "spool_bytes": w.spool_bytes, "rejected": w.points_rejected_total}
