"""TLS and basic auth for the sidecar's HTTP endpoints, from a web config file in the Prometheus
exporter-toolkit format (the ``--web.config.file`` of node_exporter and Prometheus itself).

The whole file is checked when it is loaded, so that a mistake stops ``tpuscope serve`` at start
instead of turning up at the first scrape. Keys the toolkit knows but tpuscope does not implement
are refused rather than ignored: ignoring ``cipher_suites`` would leave someone believing a
policy holds that does not.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import logging
import os
import re
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import yaml

log = logging.getLogger("tpuscope.exporter")

REALM = "tpuscope"
# How often the file (and the certificates it names) are looked at for changes: cert-manager
# rotates certificates by rewriting the files, and a stat a second costs nothing.
RELOAD_CHECK_SECONDS = 1.0

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# The toolkit's client_auth_type values, as ssl verify modes. Python's ssl verifies every client
# certificate it asks for, so the two toolkit modes that take a certificate without verifying it
# cannot be had: RequestClientCert becomes "do not ask" (tpuscope never reads the certificate,
# so a client sees no difference), and RequireAnyClientCert is refused at load.
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# Headers the toolkit lets a web config add, with the values it allows (None: any); the same
# restriction keeps a file valid for both.
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
KNOWN = {
    "": {"tls_server_config", "http_server_config", "basic_auth_users"},
    "tls_server_config": {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"},
    "http_server_config": {"headers", "http2"},
}
TOOLKIT_ONLY = {  # in the toolkit's format, not implemented here
    "": {"rate_limit"},
    "tls_server_config": {
        "cert",
        "key",
        "client_ca",
        "cipher_suites",
        "curve_preferences",
        "prefer_server_cipher_suites",
        "client_allowed_sans",
    },
    "http_server_config": set(),
}
BCRYPT_HASH = re.compile(r"\$2[abxy]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")


class WebConfigError(ValueError):
    """The web config file cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class TLSSettings:
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None
    verify_mode: ssl.VerifyMode
    min_version: ssl.TLSVersion
    max_version: ssl.TLSVersion

    def context(self) -> ssl.SSLContext:
        """A server context; raises ``ssl.SSLError`` or ``OSError`` on files it cannot use."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = self.min_version
        context.maximum_version = self.max_version
        # An encrypted key would make OpenSSL prompt on the terminal; the toolkit cannot read one either.
        context.load_cert_chain(self.cert_file, self.key_file, password=lambda: b"")
        if self.client_ca_file:
            context.load_verify_locations(self.client_ca_file)
        context.verify_mode = self.verify_mode
        return context

    def files(self) -> list[Path]:
        return [self.cert_file, self.key_file] + ([self.client_ca_file] if self.client_ca_file else [])


@dataclass(frozen=True)
class WebConfig:
    tls: ssl.SSLContext | None
    tls_files: list[Path]
    headers: list[tuple[str, str]]
    users: Authenticator | None


def load(path: Path) -> WebConfig:
    """Read and check the whole file, certificates included; ``WebConfigError`` names what is wrong."""

    def error(where: str, problem: str) -> WebConfigError:
        return WebConfigError(f"web config {path}: {where}: {problem}")

    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise WebConfigError(f"cannot read web config {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:  # e.g. a file caught half-written in the middle of a character
        raise WebConfigError(f"web config {path}: not UTF-8 text at byte {e.start}") from None
    except yaml.YAMLError as e:
        # Where and what, without PyYAML's quote of the offending line: it may hold a password hash.
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise WebConfigError(f"web config {path}: not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    top = _section(raw, "", error)
    tls_settings = _tls(_section(top.get("tls_server_config"), "tls_server_config", error), path.parent, error)
    context = None
    if tls_settings:
        try:
            context = tls_settings.context()
        except OSError as e:  # ssl.SSLError is one
            raise error("tls_server_config", f"cannot use cert_file, key_file or client_ca_file: {e}") from None
    http = _section(top.get("http_server_config"), "http_server_config", error)
    if not isinstance(http.get("http2", True), bool):
        raise error("http_server_config.http2", "must be true or false")
    # http2 may stay: it permits HTTP/2, and this server speaks HTTP/1.x only, which every scraper does.
    users = _strings(top.get("basic_auth_users"), "basic_auth_users", error)
    for user, hashed in users.items():
        if not BCRYPT_HASH.fullmatch(hashed):  # the message never quotes the value: it is a secret
            raise error(f"basic_auth_users.{user}", "not a bcrypt hash (make one with `htpasswd -nBC 10 USER`)")
    return WebConfig(
        tls=context,
        tls_files=tls_settings.files() if tls_settings else [],
        headers=list(_headers(_strings(http.get("headers"), "http_server_config.headers", error), error).items()),
        users=Authenticator(users) if users else None,
    )


def _section(value: Any, name: str, error: Callable[[str, str], WebConfigError]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise error(name or "top level", "must be a mapping")
    for key in value:
        where = f"{name}.{key}" if name else str(key)
        if key in TOOLKIT_ONLY[name]:
            raise error(where, "an exporter-toolkit setting that tpuscope does not implement; remove it")
        if key not in KNOWN[name]:
            raise error(where, f"unknown key (known here: {', '.join(sorted(KNOWN[name]))})")
    return value


def _strings(value: Any, name: str, error: Callable[[str, str], WebConfigError]) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise error(name, "must be a mapping")
    for key, item in value.items():
        if not isinstance(item, str):
            raise error(f"{name}.{key}", "must be a string")
    return {str(key): item for key, item in value.items()}


def _headers(headers: dict[str, str], error: Callable[[str, str], WebConfigError]) -> dict[str, str]:
    for name, value in headers.items():
        if name not in HEADERS:
            raise error(f"http_server_config.headers.{name}", f"cannot be set (these can: {', '.join(HEADERS)})")
        allowed = HEADERS[name]
        if allowed is not None and value not in allowed:
            raise error(f"http_server_config.headers.{name}", f"must be one of {', '.join(allowed)}")
    return headers


def _tls(section: dict[str, Any], directory: Path, error: Callable[[str, str], WebConfigError]) -> TLSSettings | None:
    for key, value in section.items():
        if not isinstance(value, str):
            raise error(f"tls_server_config.{key}", "must be a string")
    if not section:  # as the toolkit: no TLS settings at all means plain HTTP
        return None

    def file(key: str) -> Path | None:
        if not section.get(key):
            return None
        path = directory / str(section[key])  # relative to the config file, as the toolkit reads them
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            raise error(f"tls_server_config.{key}", f"cannot read {path}: {e.strerror}") from None
        return path

    def version(key: str, default: str) -> ssl.TLSVersion:
        name = section.get(key, default)
        if name not in TLS_VERSIONS:
            raise error(f"tls_server_config.{key}", f"must be one of {', '.join(TLS_VERSIONS)}")
        return TLS_VERSIONS[name]

    cert_file, key_file, client_ca_file = file("cert_file"), file("key_file"), file("client_ca_file")
    if cert_file is None or key_file is None:
        raise error("tls_server_config", "TLS needs both cert_file and key_file")
    auth = section.get("client_auth_type") or "NoClientCert"
    if auth == "RequireAnyClientCert":
        raise error(
            "tls_server_config.client_auth_type",
            "RequireAnyClientCert (a certificate nobody verifies) is not supported; "
            "use RequireAndVerifyClientCert with client_ca_file",
        )
    if auth not in CLIENT_AUTH:
        raise error("tls_server_config.client_auth_type", f"must be one of {', '.join(CLIENT_AUTH)}")
    if client_ca_file and auth == "NoClientCert":
        raise error("tls_server_config.client_ca_file", "set without a client_auth_type that asks for certificates")
    if CLIENT_AUTH[auth] != ssl.CERT_NONE and not client_ca_file:
        raise error("tls_server_config.client_auth_type", f"{auth} needs client_ca_file, the CA to verify clients with")
    min_version, max_version = version("min_version", "TLS12"), version("max_version", "TLS13")
    if min_version > max_version:
        raise error("tls_server_config.min_version", "is above max_version")
    return TLSSettings(cert_file, key_file, client_ca_file, CLIENT_AUTH[auth], min_version, max_version)


@functools.cache
def _dummy_hash(cost: int) -> bytes:
    return bcrypt.hashpw(b"not a password anyone sends", bcrypt.gensalt(rounds=cost))


class Authenticator:
    """Checks ``Authorization: Basic`` headers against the bcrypt hashes of ``basic_auth_users``."""

    def __init__(self, hashes: Mapping[str, str]) -> None:
        self._hashes = dict(hashes)
        # user -> sha256 of the password that last verified: a bcrypt check costs 50-100 ms, a scrape
        # comes every few seconds. At most one entry per configured user, so it cannot grow.
        self._verified: dict[str, bytes] = {}
        # One bcrypt check at a time, as the toolkit does: a flood of wrong passwords then costs one
        # core at most, not all of the job's.
        self._lock = threading.Lock()
        # A user name that does not exist costs a bcrypt check as dear as one that does, so that
        # timing the answer does not tell which names exist.
        self._dummy = _dummy_hash(max(int(hashed[4:6]) for hashed in self._hashes.values()))

    def allows(self, authorization: str) -> bool:
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, colon, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
            name = user.decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not colon:
            return False
        digest = hashlib.sha256(password).digest()
        verified = self._verified.get(name)
        if verified is not None and hmac.compare_digest(verified, digest):
            return True
        hashed = self._hashes.get(name)
        with self._lock:
            try:
                ok = bcrypt.checkpw(password, hashed.encode() if hashed is not None else self._dummy)
            except ValueError:  # bcrypt 5 refuses passwords over 72 bytes rather than truncating them
                ok = False
        if ok and hashed is not None:
            self._verified[name] = digest
            return True
        return False


class LiveWebConfig:
    """The web config in force: reloaded when the file or a certificate it names changes, looked at
    when a connection or request comes, no more than once a second. A reload that fails is logged
    and the previous config kept, so a half-written file during a rotation never takes the endpoint
    down."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.config = load(path)
        self._stamp = self._files_stamp()
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    def current(self) -> WebConfig:
        if time.monotonic() - self._checked < RELOAD_CHECK_SECONDS or not self._lock.acquire(blocking=False):
            return self.config  # checked a moment ago, or another thread is checking now
        try:
            self._checked = time.monotonic()
            # Stamped before reading, so that a file written while it is read (cert-manager writes
            # the certificate, then the key) is read again at the next check.
            stamp = self._files_stamp()
            if stamp != self._stamp:
                self._stamp = stamp
                self._reload()
        finally:
            self._lock.release()
        return self.config

    def _reload(self) -> None:
        try:
            config = load(self.path)
        except Exception as e:  # whatever it is, it runs in the accept loop: keep serving as before
            log.error("keeping the previous web config: %s", e)
            return
        # A file rewritten in place is empty, or half there, for a moment: never let such a moment
        # turn TLS or basic auth off (or on, which would lock the scraper out until it is restarted).
        if (config.tls is None) != (self.config.tls is None) or (config.users is None) != (self.config.users is None):
            log.error(
                "keeping the previous web config: %s turns TLS or basic auth on or off, which needs a restart",
                self.path,
            )
            return
        self.config = config
        log.info("reloaded web config %s", self.path)

    def _files_stamp(self) -> list[tuple[int, int, int] | None]:
        return [_stamp(path) for path in (self.path, *self.config.tls_files)]


def _stamp(path: Path) -> tuple[int, int, int] | None:
    # The inode too: Kubernetes updates a mounted secret by swapping a symlink, not by writing the file.
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)
