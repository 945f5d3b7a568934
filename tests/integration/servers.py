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
               scheme: str = "http", interval: str = "1s", external_labels: dict | None = None) -> tuple[Server, int]:
    """A Prometheus scraping iowarden every `interval` on scrape_port, or on several targets (a fleet: one
    daemon each, a port here or an "address:port" of another host); external_labels go on every alert it
    sends (which engine raised it, where two evaluate the same rules)."""
    port = free_port()
    targets = ", ".join(f"'{p}'" if isinstance(p, str) else f"'127.0.0.1:{p}'"
                        for p in (scrape_port if isinstance(scrape_port, list) else [scrape_port]))
    cfg = tmp_path / "prometheus.yml"
    alerting = (f"alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{alertmanager_port}']\n"
                if alertmanager_port else "")
    rules = "".join(f"  - {r}\n" for r in rule_files)
    external = "".join(f"\n    {k}: {v}" for k, v in (external_labels or {}).items())
    cfg.write_text(f"""global:
  scrape_interval: {interval}
  evaluation_interval: {interval}
{('  external_labels:' + external + chr(10)) if external else ''}{('rule_files:' + chr(10) + rules) if rules else ''}{alerting}scrape_configs:
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


def victoria_stack(tmp_path, targets: list[str], rule_files: list[str], alertmanager_port: int,
                   external_labels: dict | None = None, interval: str = "1s") -> tuple[list[Server], int]:
    """VictoriaMetrics as a fleet runs it: vmagent scraping `targets` ("address:port") every `interval` into a
    victoria-metrics, and vmalert evaluating `rule_files` against it, writing its recordings back and notifying
    the Alertmanager. Returns the servers (stop them in reverse) and victoria-metrics' port (its query API is
    Prometheus's). Every path is under tmp_path.

    Made fresh for live rules: -search.latencyOffset 1 s (a point is searchable a second after it lands, not
    30: a chain of recordings would otherwise read its inputs half a minute late), no rollup cache, vmalert's
    remote write flushed every second and its queries' step 10 s (a recording of the previous evaluation is
    found; the default 5 m would find a series minutes after it ended)."""
    vm_port, agent_port, alert_port = free_port(), free_port(), free_port()
    started: list[Server] = []
    try:
        started.append(Server(["victoria-metrics", f"-storageDataPath={tmp_path / 'vm-data'}",
                               f"-httpListenAddr=127.0.0.1:{vm_port}", "-search.latencyOffset=1s",
                               "-search.disableCache", "-loggerOutput=stdout"],
                              f"http://127.0.0.1:{vm_port}/health", str(tmp_path / "victoria-metrics.log")))
        scrape = tmp_path / "vmagent.yml"
        scrape.write_text(f"""global:
  scrape_interval: {interval}
scrape_configs:
  - job_name: iowarden
    static_configs:
      - targets: [{", ".join(f"'{t}'" for t in targets)}]
""")
        started.append(Server(["vmagent", f"-promscrape.config={scrape}", f"-httpListenAddr=127.0.0.1:{agent_port}",
                               f"-remoteWrite.url=http://127.0.0.1:{vm_port}/api/v1/write",
                               f"-remoteWrite.tmpDataPath={tmp_path / 'vmagent-queue'}",
                               "-remoteWrite.flushInterval=1s", "-loggerOutput=stdout"],
                              f"http://127.0.0.1:{agent_port}/health", str(tmp_path / "vmagent.log")))
        started.append(Server(["vmalert", *(f"-rule={r}" for r in rule_files),
                               f"-datasource.url=http://127.0.0.1:{vm_port}",
                               f"-remoteWrite.url=http://127.0.0.1:{vm_port}",
                               f"-notifier.url=http://127.0.0.1:{alertmanager_port}",
                               f"-httpListenAddr=127.0.0.1:{alert_port}", "-remoteWrite.flushInterval=1s",
                               "-datasource.queryStep=10s", "-loggerOutput=stdout",
                               *(f"-external.label={k}={v}" for k, v in (external_labels or {}).items())],
                              f"http://127.0.0.1:{alert_port}/health", str(tmp_path / "vmalert.log")))
    except BaseException:
        for server in reversed(started):
            server.stop()
        raise
    return started, vm_port


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
