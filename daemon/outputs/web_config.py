"""The endpoint's web config, as Prometheus' exporters have it (exporter-toolkit's web-config file):
TLS settings, basic-auth users with bcrypt hashes, and the listen address. Read once at start; the
HTTP server (http.py) takes what this builds."""
from __future__ import annotations


import base64
import ssl
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


def parse_basic(header: str) -> tuple[str, bytes] | None:
    if not header.startswith("Basic "):
        return None
    try:
        user, sep, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return (user, password.encode()) if sep else None
