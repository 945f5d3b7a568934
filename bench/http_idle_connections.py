"""The metrics endpoint under thousands of idle connections from one address, TLS or plain: the daemon's
peak RSS and open file descriptors, and the latency of scrapes from another address meanwhile.

    sudo .venv/bin/python bench/http_idle_connections.py [--connections 4000] [--seconds 25] [--plain]

The hostile client is 127.0.0.9, the scraper 127.0.0.1 (all of 127/8 is this machine). Every socket and
the daemon are closed at the end. The issue's goal: under 100 MB, under the unit's LimitNOFILE (8192),
every scrape from the other address in under 1 s.
"""
import argparse
import os
import resource
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time

import psutil

from _support import free_port


def scrape(port: int, ctx: ssl.SSLContext | None) -> float:
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.1", 0)) as raw:
        s = ctx.wrap_socket(raw, server_hostname="127.0.0.1") if ctx else raw
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
    if not data.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"a scrape from 127.0.0.1 got {data[:40]!r}")
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--connections", type=int, default=4000)
    ap.add_argument("--seconds", type=float, default=25.0)
    ap.add_argument("--plain", action="store_true", help="plain HTTP instead of TLS")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.connections + 1024), hard))
    work = tempfile.mkdtemp(prefix="iowarden-bench-")
    port = free_port()
    ctx = None
    web = ""
    if not args.plain:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{work}/s.key",
                        "-out", f"{work}/s.crt", "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        with open(f"{work}/web.yml", "w") as f:
            f.write(f"tls_server_config:\n  cert_file: {work}/s.crt\n  key_file: {work}/s.key\n")
        web = f'web_config_file = "{work}/web.yml"\n'
        ctx = ssl.create_default_context(cafile=f"{work}/s.crt")
    with open(f"{work}/config.toml", "w") as f:
        f.write(f'[prometheus]\nlisten_address = "127.0.0.1:{port}"\n{web}[daemon]\nstate_dir = "{work}/state"\n')
    daemon = subprocess.Popen([sys.executable, "-m", "iowarden.daemon.cli", "run", "-c", f"{work}/config.toml"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    socks = []
    try:
        proc = psutil.Process(daemon.pid)
        deadline = time.monotonic() + 30
        while True:
            try:
                scrape(port, ctx)
                break
            except (OSError, SystemExit):
                if time.monotonic() > deadline:
                    raise SystemExit("the daemon did not serve /metrics within 30 s")
                time.sleep(0.5)
        rss0, fds0 = proc.memory_info().rss, proc.num_fds()
        for _ in range(args.connections):
            s = socket.socket()
            s.setblocking(False)
            s.bind(("127.0.0.9", 0))
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            socks.append(s)
        peak_rss, peak_fds, times = rss0, fds0, []
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            times.append(scrape(port, ctx))
            peak_rss, peak_fds = max(peak_rss, proc.memory_info().rss), max(peak_fds, proc.num_fds())
            time.sleep(1.0)
        limit = int(subprocess.run(["awk", '/^LimitNOFILE=/{sub("LimitNOFILE=","");print}',
                                    os.path.join(os.path.dirname(__file__), "..", "systemd", "iowarden.service")],
                                   capture_output=True, text=True).stdout.strip() or 0)
        times.sort()
        print(f"{args.connections} idle {'plain' if args.plain else 'TLS'} connections from 127.0.0.9, held "
              f"{args.seconds:g} s")
        print(f"daemon RSS {rss0 / 2**20:.0f} MiB before, peak {peak_rss / 2**20:.0f} MiB; open fds {fds0} before, "
              f"peak {peak_fds} (the unit's LimitNOFILE: {limit})")
        print(f"{len(times)} scrapes from 127.0.0.1: median {times[len(times) // 2] * 1000:.0f} ms, slowest "
              f"{times[-1] * 1000:.0f} ms")
    finally:
        for s in socks:
            s.close()
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
