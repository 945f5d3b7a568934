"""The /metrics endpoint, secured the way Prometheus' own exporters are: a web-config file.

    tls_server_config:
      cert_file: /etc/iowarden/tls.crt
      key_file: /etc/iowarden/tls.key
      client_auth_type: RequireAndVerifyClientCert   # or VerifyClientCertIfGiven, NoClientCert
      client_ca_file: /etc/iowarden/clients-ca.crt
      min_version: TLS12
    basic_auth_users:
      prometheus: $2b$12$...   # bcrypt hash (htpasswd -nBC 12 prometheus)

client_python's start_http_server has TLS but no basic auth, hence this small
server. Scrapes only render the collector's snapshot; nothing here does I/O work.
"""
from __future__ import annotations

import base64
import hashlib
import logging
import socket
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("iowarden")

CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


class WebConfigError(ValueError):
    pass


@dataclass
class WebConfig:
    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)   # user -> bcrypt hash


def load_web_config(path: str) -> WebConfig:
    import yaml
    try:
        with open(path) as f:
            doc = yaml.safe_load(f) or {}
    except OSError as exc:
        raise WebConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise WebConfigError(f"{path}:{mark.line + 1 if mark else 1}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise WebConfigError(f"{path}: expected a mapping at the top")
    unknown = set(doc) - {"tls_server_config", "basic_auth_users", "http_server_config"}
    if unknown:
        raise WebConfigError(f"{path}: unknown keys: {', '.join(sorted(unknown))}")
    wc = WebConfig()
    tls = doc.get("tls_server_config")
    if tls:
        try:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = TLS_VERSIONS[tls.get("min_version", "TLS12")]
            ctx.load_cert_chain(tls["cert_file"], tls["key_file"])
            auth = tls.get("client_auth_type", "NoClientCert")
            ctx.verify_mode = CLIENT_AUTH[auth]
            if ctx.verify_mode != ssl.CERT_NONE:
                if not tls.get("client_ca_file"):
                    raise WebConfigError(f"{path}: client_auth_type {auth} needs client_ca_file")
                ctx.load_verify_locations(tls["client_ca_file"])
        except KeyError as exc:
            raise WebConfigError(f"{path}: tls_server_config: missing or unknown {exc}") from None
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"{path}: tls_server_config: {exc}") from None
        wc.tls = ctx
    users = doc.get("basic_auth_users") or {}
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise WebConfigError(f"{path}: basic_auth_users.{user}: not a bcrypt hash")
        wc.users[str(user)] = hashed.encode()
    return wc


class _Handler(BaseHTTPRequestHandler):
    server_version = "iowarden"

    def log_message(self, fmt, *args):  # scrapes are not worth a journal line each
        pass

    def _authorized(self) -> bool:
        users = self.server.web.users
        if not users:
            return True
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = users.get(user)
        return hashed is not None and self.server.check_password(user, password.encode(), hashed)

    def do_GET(self):
        if not self._authorized():
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="iowarden"')
            self.end_headers()
            return
        if self.path.split("?")[0] == "/metrics":
            body = generate_latest(self.server.registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        elif self.path == "/":
            body = b"<html><body><h1>iowarden</h1><a href='/metrics'>metrics</a></body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
        else:
            body = b"not found\n"
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, family, registry, web: WebConfig):
        self.address_family = family
        super().__init__(addr, _Handler)
        self.registry, self.web = registry, web
        self._cache: dict[tuple[str, bytes], bool] = {}
        self._cache_lock = threading.Lock()

    def finish_request(self, request, client_address):
        # The TLS handshake runs here, in the request's own thread, so a slow or
        # hostile client cannot hold up the accept loop.
        if self.web.tls:
            try:
                request = self.web.tls.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                log.debug("TLS handshake with %s failed: %s", client_address[0], exc)
                request.close()
                return
        super().finish_request(request, client_address)

    def check_password(self, user: str, password: bytes, hashed: bytes) -> bool:
        """bcrypt is slow on purpose (~0.2 s): remember good answers so a 1 s scrape stays cheap."""
        import bcrypt
        key = (user, hashlib.sha256(password + b"\0" + hashed).digest())
        with self._cache_lock:
            if key in self._cache:
                return self._cache[key]
        ok = bcrypt.checkpw(password, hashed)
        with self._cache_lock:
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[key] = ok
        return ok

    def server_bind(self):
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # ":port" serves IPv4 too
        super().server_bind()

    def handle_error(self, request, client_address):
        log.debug("metrics request from %s failed", client_address[0], exc_info=True)


def parse_listen_address(text: str) -> tuple[tuple, int]:
    """':29110' (all interfaces), '127.0.0.1:29110', '[::1]:29110' -> (bind address, family)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address {text!r} is not HOST:PORT")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"listen address {text!r}: the port must be 1-65535")
    host = host.strip("[]")
    if host in ("", "::"):
        return ("::", int(port)), socket.AF_INET6
    return (host, int(port)), socket.AF_INET6 if ":" in host else socket.AF_INET


def serve(listen: str, registry, web: WebConfig) -> _Server:
    addr, family = parse_listen_address(listen)
    server = _Server(addr, family, registry, web)
    threading.Thread(target=server.serve_forever, name="iowarden-http", daemon=True).start()
    return server


