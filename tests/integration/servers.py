"""Real servers from Debian's packages, started on loopback for a test and stopped by their own pid."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.integration.helpers import free_port


class Server:
    def __init__(self, argv: list[str], ready_url: str, log_path: str, timeout: float = 60,
                 ready_headers: dict | None = None):
        self.log = open(log_path, "w+")
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited: {self.output()[-2000:]}")
            try:
                with urllib.request.urlopen(urllib.request.Request(ready_url, headers=ready_headers or {}),
                                            timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{argv[0]} not ready at {ready_url} in {timeout} s")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def prometheus(tmp_path, scrape_port: int | list[int | str], rule_files=(), alertmanager_port: int | None = None,
               scheme: str = "http", interval: str = "1s") -> tuple[Server, int]:
    """A Prometheus scraping iowarden every `interval` on scrape_port, or on several targets (a fleet: one
    daemon each, a port here or an "address:port" of another host)."""
    port = free_port()
    targets = ", ".join(f"'{p}'" if isinstance(p, str) else f"'127.0.0.1:{p}'"
                        for p in (scrape_port if isinstance(scrape_port, list) else [scrape_port]))
    cfg = tmp_path / "prometheus.yml"
    alerting = (f"alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{alertmanager_port}']\n"
                if alertmanager_port else "")
    rules = "".join(f"  - {r}\n" for r in rule_files)
    cfg.write_text(f"""global:
  scrape_interval: {interval}
  evaluation_interval: {interval}
{('rule_files:' + chr(10) + rules) if rules else ''}{alerting}scrape_configs:
  - job_name: iowarden
    scheme: {scheme}
    static_configs:
      - targets: [{targets}]
""")
    return Server(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                   f"--web.listen-address=127.0.0.1:{port}"], f"http://127.0.0.1:{port}/-/ready",
                  str(tmp_path / "prometheus.log")), port


def query(port: int, expr: str, at: float | None = None) -> dict:
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def query_alerts(port: int) -> list[dict]:
    """Prometheus's alerts now (pending and firing), with their labels, annotations and activeAt."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=10) as r:
        return json.loads(r.read())["data"]["alerts"]


def alertmanager(tmp_path, webhook_port: int) -> tuple[Server, int]:
    port = free_port()
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(f"""route:
  receiver: hook
  group_by: [alertname, volume]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: http://127.0.0.1:{webhook_port}/
        send_resolved: true
""")
    return Server(["prometheus-alertmanager", f"--config.file={cfg}", f"--storage.path={tmp_path / 'am'}",
                   f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                  f"http://127.0.0.1:{port}/-/ready", str(tmp_path / "alertmanager.log")), port


def victoria_metrics(storage, port: int, log_path: str) -> Server:
    return Server(["victoria-metrics", f"-storageDataPath={storage}", f"-httpListenAddr=127.0.0.1:{port}"],
                  f"http://127.0.0.1:{port}/health", log_path)


def serve_in_thread(handler) -> tuple[ThreadingHTTPServer, int]:
    """A small HTTP server of the test's own on a free loopback port; stop it with shutdown()."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


class Webhook:
    """An Alertmanager webhook receiver: every POSTed JSON document, in order."""

    def __init__(self):
        self.payloads: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.payloads.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server, self.port = serve_in_thread(Handler)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
