"""The endpoint's web config, as Prometheus' exporters have it (exporter-toolkit's web-config file):
TLS settings, basic-auth users with bcrypt hashes, and the listen address. Read once at start; the
HTTP server (http.py) takes what this builds."""
from __future__ import annotations


import base64
import collections


import hashlib


import socket
import ssl
import threading
import time
from dataclasses import dataclass, field

from iowarden.probes.common import read_bounded


CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
}
WEB_CONFIG_MAX_BYTES = 1 << 20
FAILED_AUTH_PER_SOURCE = 5
FAILED_AUTH_WINDOW_SECONDS = 300.0
MAX_HASHES_WAITING = 4               # checks queued for the one hashing thread; more get 503
GOOD_CREDENTIALS_KEPT = 64

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
        doc = yaml.safe_load(read_bounded(path, WEB_CONFIG_MAX_BYTES).decode("utf-8")) or {}
    except OSError as exc:
        raise WebConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise WebConfigError(f"{path}: not UTF-8 text") from None
    except RecursionError:
        raise WebConfigError(f"{path}: nested too deeply to read") from None
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


class BasicAuth:
    """Who may scrape, at a bounded cost in bcrypt work (see the module's docstring)."""

    def __init__(self, users: dict[str, bytes], clock=time.monotonic):
        import bcrypt
        self.users = users
        self.clock = clock
        # an unknown user is checked against this, at the cost of the real hashes
        cost = max((int(h.split(b"$")[2]) for h in users.values()), default=4)
        self._dummy = bcrypt.hashpw(b"iowarden-dummy", bcrypt.gensalt(rounds=cost))
        self._good: collections.OrderedDict[bytes, bool] = collections.OrderedDict()
        self._failures: dict[str, collections.deque] = {}
        self._lock = threading.Lock()
        self.hashes_total = 0          # bcrypt checks run: what clients made the daemon spend
        self.refused_total = 0         # checks refused without a hash (429 or 503)

    def _key(self, user: str, password: bytes) -> bytes:
        hashed = self.users.get(user, self._dummy)
        return hashlib.sha256(user.encode() + b"\0" + password + b"\0" + hashed).digest()

    def remembered(self, user: str, password: bytes) -> bool:
        with self._lock:
            key = self._key(user, password)
            if key in self._good:
                self._good.move_to_end(key)
                return True
        return False

    def over_limit(self, source: str) -> bool:
        now = self.clock()
        with self._lock:
            q = self._failures.get(source)
            while q and q[0] < now - FAILED_AUTH_WINDOW_SECONDS:
                q.popleft()
            return bool(q) and len(q) >= FAILED_AUTH_PER_SOURCE

    def verify(self, user: str, password: bytes, source: str) -> bool:
        """Run one bcrypt check (the caller bounds how many run at once) and remember its outcome."""
        import bcrypt
        known = user in self.users
        # bcrypt reads 72 bytes at most (and bcrypt 5 refuses more): no stored password is longer
        ok = len(password) <= 72 and bcrypt.checkpw(password, self.users.get(user, self._dummy)) and known
        with self._lock:
            self.hashes_total += 1
            if ok:
                self._good[self._key(user, password)] = True
                while len(self._good) > GOOD_CREDENTIALS_KEPT:
                    self._good.popitem(last=False)
            else:
                q = self._failures.setdefault(source, collections.deque())
                q.append(self.clock())
                if len(self._failures) > 4096:   # a bound on the sources remembered: the oldest go
                    for old in list(self._failures)[:2048]:
                        del self._failures[old]
        return ok


def _parse_basic(header: str) -> tuple[str, bytes] | None:
    if not header.startswith("Basic "):
        return None
    try:
        user, sep, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return (user, password.encode()) if sep else None


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
