"""Hostile clients of the metrics endpoint in a process of their own, so that a test timing its own scrape
times the daemon and not its own interpreter (threads of the test's process hold its interpreter while the
scrape's answer waits to be read).

    python hostile_load.py PORT STATUS_FILE --flood A,B C,D ... --hold-sources X,Y --hold-per-source N

--flood: one thread per group, each keeping one wrong password in flight, rotating over the group's addresses.
--hold-sources: connections that never send a byte, `--hold-per-source` from each, re-opened as the server
closes them (every place they can get, held). Every half second, and once more at SIGTERM or SIGINT, the
status file is replaced with {"heard": {address: 401s}, "opened": connections opened}. Runs until told to
stop, or for --seconds at most.
"""
import argparse
import json
import os
import selectors
import signal
import socket
import threading
import time
from base64 import b64encode


def get(port, user, password, source, timeout=10.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
    try:
        auth = b64encode(f"{user}:{password}".encode()).decode()
        s.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\nConnection: close\r\n\r\n"
                  .encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    finally:
        s.close()
    return int(data.split(b" ", 2)[1]) if data else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("status_file")
    ap.add_argument("--flood", nargs="*", default=[])
    ap.add_argument("--hold-sources", default="")
    ap.add_argument("--hold-per-source", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=600.0)
    args = ap.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    heard: dict[str, int] = {}
    opened = [0]
    lock = threading.Lock()

    def flood(sources):
        i = 0
        while not stop.is_set():
            source = sources[i % len(sources)]
            i += 1
            try:
                status = get(args.port, "prometheus", f"guess{i}", source)
            except OSError:
                continue
            if status == 401:
                with lock:
                    heard[source] = heard.get(source, 0) + 1

    def hold(sources):
        sel = selectors.DefaultSelector()

        def open_one(source):
            s = socket.socket()
            s.setblocking(False)
            s.bind((source, 0))
            s.connect_ex(("127.0.0.1", args.port))
            sel.register(s, selectors.EVENT_READ, source)
            opened[0] += 1

        for source in sources:
            for _ in range(args.hold_per_source):
                open_one(source)
        reopen: list[tuple[float, str]] = []   # a closed place is taken again 50 ms later, not in a tight loop
        while not stop.is_set():
            now = time.monotonic()
            while reopen and reopen[0][0] <= now:
                open_one(reopen.pop(0)[1])
            for key, _ in sel.select(0.02):
                try:
                    data = key.fileobj.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
                    reopen.append((time.monotonic() + 0.05, key.data))
        for key in list(sel.get_map().values()):
            key.fileobj.close()
        sel.close()

    def write_status():
        with lock:
            status = {"heard": dict(heard), "opened": opened[0]}
        tmp = args.status_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(status, f)
        os.replace(tmp, args.status_file)

    threads = [threading.Thread(target=flood, args=(group.split(","),), daemon=True) for group in args.flood]
    if args.hold_sources and args.hold_per_source:
        threads.append(threading.Thread(target=hold, args=(args.hold_sources.split(","),), daemon=True))
    for t in threads:
        t.start()
    end = time.monotonic() + args.seconds
    while not stop.wait(0.5) and time.monotonic() < end:
        write_status()
    stop.set()
    for t in threads:
        t.join(15)
    write_status()


if __name__ == "__main__":
    main()
