"""A daemon starting on a large state database, and `iowarden status` on it: time to the first /metrics and
status's time and peak memory, beside the bounds they must keep (serve within 10 s; systemd's start timeout
is 90 s).

    .venv/bin/python bench/big_state.py [--gigabytes 9]

The database is made here (probe results with 4 KiB records and a million drift rows, in the daemon's own
schema), in a directory of this run's own, removed at the end. No root needed.
"""
import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from _support import free_port  # noqa: E402

SERVE_WITHIN_SECONDS = 10.0


def make_database(path: str, gigabytes: float) -> float:
    from iowarden.daemon.core.state import State
    State(path).close()
    rows = int(gigabytes * (1 << 30) / 4400)
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=OFF")
    t0 = time.time() - 80 * 86400
    step = 200_000
    for start in range(0, rows, step):
        n = min(step, rows - start)
        db.execute("BEGIN")
        db.execute(f"""WITH RECURSIVE c(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM c LIMIT {n})
            INSERT INTO probe_results (started_at, target, profile, device, identity, ok, contended, read_iops,
                duration_seconds, record)
            SELECT {t0} + ({start} + x) * 3.0, 'db', 'randread-4k', 'sdb', 'wwn:1', 1, 0, 1000.0, 5.0,
                   '{{"pad":"' || hex(randomblob(2048)) || '"}}' FROM c""")
        db.execute("COMMIT")
    db.execute("BEGIN")
    db.execute(f"""WITH RECURSIVE c(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM c LIMIT 1000000)
        INSERT INTO drift_events (at, device, identity, setting, old_value, new_value)
        SELECT {t0} + x, 'sd' || (x % 500), NULL, 'scheduler', 'none', 'bfq' FROM c""")
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return os.path.getsize(path) / (1 << 30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gigabytes", type=float, default=9.0)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix=f"iowarden-bigstate-{os.getpid()}-")
    proc = None
    try:
        state_dir = os.path.join(work, "state")
        os.makedirs(state_dir, mode=0o700)
        made = time.monotonic()
        size = make_database(os.path.join(state_dir, "state.db"), args.gigabytes)
        print(f"state database: {size:.2f} GiB ({time.monotonic() - made:.0f} s to make)")
        port = free_port()
        cfg = os.path.join(work, "config.toml")
        with open(cfg, "w") as f:
            f.write(f'[daemon]\nstate_dir = "{state_dir}"\nlog_level = "warning"\n'
                    f'[prometheus]\nlisten_address = "127.0.0.1:{port}"\n[tracer]\nenabled = false\n'
                    f'[sampler]\ndevices = ["iowarden-none"]\n[smart]\nenabled = false\n')
        # the page cache as a restart after a reboot finds it: cold
        subprocess.run(["sh", "-c", "sync; echo 1 > /proc/sys/vm/drop_caches"], check=False, stderr=subprocess.DEVNULL)
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "iowarden.daemon.cli", "run", "-c", cfg],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        served = None
        while time.monotonic() - started < 300:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
                served = time.monotonic() - started
                break
            except OSError:
                time.sleep(0.1)
        print(f"{'daemon: start to first /metrics 200':44} {served if served is not None else float('nan'):>8.2f} s"
              f"   (bound {SERVE_WITHIN_SECONDS:g} s)")
        t0 = time.monotonic()
        r = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "iowarden.daemon.cli", "status", "-c",
                            cfg, "--json"], capture_output=True, text=True, timeout=600)
        took = time.monotonic() - t0
        peak_kib = int(r.stderr.strip().split("\n")[-1]) if r.stderr.strip().split("\n")[-1].isdigit() else -1
        print(f"{'iowarden status --json':44} {took:>8.2f} s   peak RSS {peak_kib / 1024:.0f} MiB (exit {r.returncode})")
        t0 = time.monotonic()
        proc.terminate()
        code = proc.wait(timeout=60)
        print(f"{'daemon: SIGTERM to exit':44} {time.monotonic() - t0:>8.2f} s   (exit {code}; the unit allows 20 s)")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
