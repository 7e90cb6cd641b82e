"""``tpuscope serve --web-config-file``: TLS, client certificates and basic auth, proven with a real
Prometheus and real TLS clients; bad web configs; and the event socket's safety where
test_sidecar.py leaves off."""

from __future__ import annotations

import base64
import datetime
import http.client
import ipaddress
import json
import os
import secrets
import socket
import ssl
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from conftest import require, sockets
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tpuscope import catalog
from tpuscope.exporter.http import _SecureHandler
from tpuscope.testing.prometheus import PrometheusServer, target_of
from tpuscope.testing.waiting import scrape_until, wait_for
from tpuscope.workload.sidecar import SidecarProcess

USER = "prometheus"
PASSWORD = secrets.token_urlsafe(16)  # distinctive, so that finding it anywhere means it leaked
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()


# --- a small PKI, made with the cryptography package ---------------------------------------------


@dataclass
class Issued:
    cert: Path
    key: Path
    der: bytes  # the certificate as a TLS peer sees it


def issue(
    directory: Path, name: str, issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None, **kind: bool
) -> tuple[Issued, x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A certificate and key written as ``name.crt`` and ``name.key``: a CA when ``ca=True``, else a
    server certificate for 127.0.0.1 and localhost, or a client one with ``client=True``; self-signed
    without ``issuer``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"tpuscope test {name}")])
    issuer_cert, issuer_key = issuer or (None, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_cert.subject if issuer_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=kind.get("ca", False), path_length=None), critical=True)
    )
    if kind.get("ca"):
        signs_only = dict.fromkeys(
            ["content_commitment", "key_encipherment", "data_encipherment", "key_agreement", "encipher_only"], False
        )
        usage = x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, decipher_only=False, **signs_only
        )
        builder = builder.add_extension(usage, critical=True)
    elif kind.get("client"):
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    else:
        sans = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    issued = Issued(directory / f"{name}.crt", directory / f"{name}.key", cert.public_bytes(serialization.Encoding.DER))
    pem_key = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    replace(issued.key, pem_key)
    replace(issued.cert, cert.public_bytes(serialization.Encoding.PEM))
    return issued, cert, key


def replace(path: Path, data: bytes) -> None:
    """Written aside and renamed, as cert-manager and Kubernetes secret mounts replace files."""
    aside = path.with_name(path.name + ".new")
    aside.write_bytes(data)
    os.replace(aside, path)


@dataclass
class Pki:
    directory: Path
    ca: Issued
    server: Issued
    client: Issued
    rogue_client: Issued  # self-signed: no CA we trust vouches for it
    ca_pair: tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


@pytest.fixture(scope="module")
def pki(module_tmp: Path) -> Pki:
    directory = module_tmp / "pki"
    directory.mkdir()
    ca, ca_cert, ca_key = issue(directory, "ca", ca=True)
    server, _, _ = issue(directory, "server", (ca_cert, ca_key))
    client, _, _ = issue(directory, "client", (ca_cert, ca_key), client=True)
    rogue, _, _ = issue(directory, "rogue", client=True)
    return Pki(directory, ca, server, client, rogue, (ca_cert, ca_key))


def write_web_config(path: Path, config: dict[str, Any]) -> Path:
    replace(path, yaml.safe_dump(config).encode())
    return path


def tls_config(**extra: Any) -> dict[str, Any]:
    # Relative paths: the sidecar runs elsewhere, so they only resolve against the config's directory.
    return {"cert_file": "server.crt", "key_file": "server.key", **extra}


SECURED = {
    "tls_server_config": tls_config(),
    "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
    "basic_auth_users": {USER: HASH},
}


@pytest.fixture(scope="module")
def secured(pki: Pki, module_tmp: Path) -> Iterator[SidecarProcess]:
    """A sidecar with TLS, basic auth and an extra header, logging at debug level."""
    config = write_web_config(pki.directory / "web.yml", SECURED)
    with SidecarProcess(
        module_tmp / "tls.sock", "127.0.0.1:0", "--web-config-file", str(config), "--log-level", "debug"
    ) as sidecar:
        yield sidecar


def client_context(pki: Pki, cert: Issued | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki.ca.cert)
    if cert:
        context.load_cert_chain(cert.cert, cert.key)
    return context


def get(
    url: str, context: ssl.SSLContext | None, password: str | None = PASSWORD, user: str = USER
) -> tuple[int, Any, bytes]:
    """Status, headers and body of a GET, with basic auth unless ``password`` is None."""
    request = urllib.request.Request(url)
    if password is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


# --- TLS and basic auth ---------------------------------------------------------------------------


def test_prometheus_scrapes_over_tls_with_credentials_and_is_refused_without(
    secured: SidecarProcess, pki: Pki, short_tmp: Path
) -> None:
    require("prometheus")
    assert secured.url.startswith("https://127.0.0.1:")
    target = [target_of(secured.url)]

    def scrape(password: str) -> dict[str, Any]:
        return {
            "scheme": "https",
            "tls_config": {"ca_file": str(pki.ca.cert)},
            "basic_auth": {"username": USER, "password": password},
        }

    with (
        PrometheusServer(short_tmp / "good", target, scrape=scrape(PASSWORD)) as good,
        PrometheusServer(short_tmp / "bad", target, scrape=scrape("wrong")) as bad,
    ):
        wait_for(
            lambda: good.scalar('up{job="tpuscope"}') == 1,
            30,
            "good.scalar('up{job=\"tpuscope\"}') == 1",
            detail=lambda: good.log_path.read_text(),
        )
        assert good.scalar(f"sum({catalog.BUILD_INFO.name})") == 1
        wait_for(lambda: bad.scalar('up{job="tpuscope"}') == 0, 30, "bad.scalar('up{job=\"tpuscope\"}') == 0")
        with urllib.request.urlopen(bad.url + "/api/v1/targets", timeout=10) as r:
            (active,) = json.load(r)["data"]["activeTargets"]
    assert active["health"] == "down"
    assert "401" in active["lastError"] and "Unauthorized" in active["lastError"], active["lastError"]


def test_every_path_needs_the_password(secured: SidecarProcess, pki: Pki) -> None:
    context = client_context(pki)
    for path in ("/metrics", "/healthz", "/", "/nothing-here"):
        url = secured.url.replace("/metrics", path)
        status, headers, _ = get(url, context, password=None)
        assert status == 401, path
        assert headers["WWW-Authenticate"] == 'Basic realm="tpuscope"'
        assert headers["X-Content-Type-Options"] == "nosniff"  # the config's headers go on refusals too
        assert get(url, context, password="wrong")[0] == 401, path
    status, headers, body = get(secured.url, context)
    assert status == 200 and catalog.BUILD_INFO.name.encode() in body
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert get(secured.url.replace("/metrics", "/healthz"), context)[0] == 200
    # An unknown user with the right password is as refused as a known one with a wrong password.
    assert get(secured.url, context, user="mallory")[0] == 401


def test_plain_http_to_the_tls_port_gets_nothing(secured: SidecarProcess, pki: Pki) -> None:
    with pytest.raises((OSError, http.client.HTTPException)):
        get(secured.url.replace("https://", "http://"), None)
    assert get(secured.url, client_context(pki))[0] == 200  # and the server is none the worse


def holds(sidecar: SidecarProcess, client: socket.socket) -> bool:
    """Whether the sidecar has accepted ``client``'s connection: a socket of its own with the two ends swapped
    (one still in the listen backlog belongs to no process)."""
    ends = (client.getpeername(), client.getsockname())
    return any((tuple(c.laddr), tuple(c.raddr)) == ends for c in sockets(sidecar.proc.pid, "tcp"))


def test_a_silent_client_does_not_hold_up_others(secured: SidecarProcess, pki: Pki) -> None:
    """The handshake happens on the connection's thread: a client that connects and never speaks
    would otherwise block the accept loop and every scrape behind it."""
    host, port = target_of(secured.url).rsplit(":", 1)
    with socket.create_connection((host, int(port))) as silent:
        wait_for(lambda: holds(secured, silent), 20, "the sidecar's accept of the silent connection")
        started = time.monotonic()
        assert get(secured.url, client_context(pki))[0] == 200
        # Queued behind the silent client, the scrape would wait for the server to give up on it.
        assert time.monotonic() - started < _SecureHandler.timeout


def test_secrets_appear_neither_in_metrics_nor_in_the_log(secured: SidecarProcess, pki: Pki) -> None:
    context = client_context(pki)
    for password in (PASSWORD, "wrong", None):
        get(secured.url, context, password=password)
    status, _, body = get(secured.url, context)
    assert status == 200
    log = secured.log()
    for secret in (PASSWORD, HASH, HASH[7:]):  # the hash with and without its $2b$10$ prefix
        assert secret not in body.decode()
        assert secret not in log


def test_client_certificates_are_required_and_verified(pki: Pki, short_tmp: Path) -> None:
    config = write_web_config(
        pki.directory / "mtls.yml",
        {"tls_server_config": tls_config(client_auth_type="RequireAndVerifyClientCert", client_ca_file="ca.crt")},
    )
    with SidecarProcess(short_tmp / "events.sock", "127.0.0.1:0", "--web-config-file", str(config)) as sidecar:
        assert get(sidecar.url, client_context(pki, pki.client), password=None)[0] == 200
        for refused in (client_context(pki), client_context(pki, pki.rogue_client)):
            with pytest.raises((OSError, http.client.HTTPException)):
                get(sidecar.url, refused, password=None)
    promtool = require("promtool")
    check = subprocess.run([promtool, "check", "web-config", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_promtool_accepts_our_web_config(secured: SidecarProcess, pki: Pki) -> None:
    """The very file the secured sidecar runs with: the format is the exporter-toolkit's."""
    promtool = require("promtool")
    check = subprocess.run(
        [promtool, "check", "web-config", str(pki.directory / "web.yml")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_web_config_and_certificates_are_reloaded_when_they_change(pki: Pki, short_tmp: Path) -> None:
    directory = short_tmp / "rotating"
    directory.mkdir()
    for path in (pki.server.cert, pki.server.key):
        (directory / path.name).write_bytes(path.read_bytes())
    config = write_web_config(directory / "web.yml", SECURED)
    context = client_context(pki)
    with SidecarProcess(short_tmp / "events.sock", "127.0.0.1:0", "--web-config-file", str(config)) as sidecar:
        assert get(sidecar.url, context)[0] == 200
        # A new password...
        new_password = secrets.token_urlsafe(16)
        new_hash = bcrypt.hashpw(new_password.encode(), bcrypt.gensalt(rounds=4)).decode()
        write_web_config(config, {**SECURED, "basic_auth_users": {USER: new_hash}})
        wait_for(
            lambda: get(sidecar.url, context, password=new_password)[0] == 200,
            10,
            "get(sidecar.url, context, password=new_password)[0] == 200",
        )
        assert get(sidecar.url, context)[0] == 401
        # ...a rotated certificate, the config file untouched...
        rotated, _, _ = issue(directory, "server", pki.ca_pair)
        wait_for(
            lambda: peer_certificate(sidecar.url, context) == rotated.der,
            10,
            "peer_certificate(sidecar.url, context) == rotated.der",
        )
        # ...and a broken file, which is logged and leaves the last good config in force.
        config.write_text("basic_auth_users: [")
        # The file is looked at when a request comes, so requests it is that find the breakage.
        wait_for(
            lambda: get(sidecar.url, context, password=new_password)[0] == 200 and "not valid YAML" in sidecar.log(),
            10,
            'get(sidecar.url, context, password=new_password)[0] == 200 and "not valid YAML" in sidecar.log()',
            detail=lambda: sidecar.log(),
        )
        # A file caught half-written: a cut multi-byte character, then an empty file (a rewrite in place,
        # `cat new > web.yml`). Neither may stop the server, nor turn basic auth off for a moment.
        config.write_bytes("# r\u00e9sum\u00e9\n".encode()[:4])
        wait_for(
            lambda: get(sidecar.url, context, password=new_password)[0] == 200 and "not UTF-8" in sidecar.log(),
            10,
            'get(sidecar.url, context, password=new_password)[0] == 200 and "not UTF-8" in sidecar.log()',
            detail=lambda: sidecar.log(),
        )
        config.write_text(yaml.safe_dump({"tls_server_config": SECURED["tls_server_config"]}))
        wait_for(
            lambda: get(sidecar.url, context)[0] == 401 and "turns TLS or basic auth on or off" in sidecar.log(),
            10,
            'get(sidecar.url, context)[0] == 401 and "turns TLS or basic auth on or off" in sidecar.log()',
            detail=lambda: sidecar.log(),
        )
        assert get(sidecar.url, context, password=new_password)[0] == 200


def peer_certificate(url: str, context: ssl.SSLContext) -> bytes | None:
    host, port = target_of(url).rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        return tls.getpeercert(binary_form=True)


# --- configs that stop the sidecar at start -------------------------------------------------------


def serve(socket_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuscope", "serve", "--listen", "127.0.0.1:0", "--socket", str(socket_path), *extra],
        capture_output=True,
        text=True,
        timeout=30,
    )


# name: (the config, what the message must name, whether promtool refuses it too)
BAD_CONFIGS: dict[str, tuple[dict[str, Any] | str, str, bool]] = {
    "unknown key": ({"basic_auth_user": {USER: HASH}}, "basic_auth_user: unknown key", True),
    "toolkit key we lack": (
        {"tls_server_config": tls_config(cipher_suites=["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"])},
        "tls_server_config.cipher_suites",
        False,
    ),
    "missing cert": ({"tls_server_config": tls_config(cert_file="gone.crt")}, "tls_server_config.cert_file", True),
    "plain password": ({"basic_auth_users": {USER: "hunter2-in-clear"}}, f"basic_auth_users.{USER}", True),
    "header not allowed": (
        {"http_server_config": {"headers": {"Set-Cookie": "a=b"}}},
        "http_server_config.headers.Set-Cookie",
        True,
    ),
    "bad YAML": ("tls_server_config: [cert_file", "not valid YAML", True),
}


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_a_bad_web_config_stops_serve_with_a_message_naming_it(case: str, pki: Pki, short_tmp: Path) -> None:
    config, named, promtool_refuses = BAD_CONFIGS[case]
    path = pki.directory / f"bad-{case.replace(' ', '-')}.yml"
    if isinstance(config, str):
        path.write_text(config)
    else:
        write_web_config(path, config)
    socket_path = short_tmp / "events.sock"
    proc = serve(socket_path, "--web-config-file", str(path))
    assert proc.returncode == 1, proc.stderr
    assert str(path) in proc.stderr and named in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "hunter2-in-clear" not in proc.stderr  # a value that should have been a hash is a secret still
    assert not os.path.lexists(socket_path)
    if promtool_refuses:  # the same mistakes the toolkit refuses
        check = subprocess.run([require("promtool"), "check", "web-config", str(path)], capture_output=True)
        assert check.returncode != 0


# --- the event socket (test_sidecar.py covers a regular file or a symlink to one at its path) ----


def test_the_socket_stays_private_while_a_job_is_connected(short_tmp: Path) -> None:
    path = short_tmp / "events.sock"
    with SidecarProcess(path) as sidecar, socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as job:
        job.connect(str(path))
        job.send(b"{}")
        read = catalog.INGEST_EVENTS.name
        scrape_until(sidecar.url, lambda s: s.value(read, result=catalog.INVALID) == 1)  # accepted and read
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600


def test_the_socket_directory_is_created_private(short_tmp: Path) -> None:
    directory = short_tmp / "run" / "tpuscope"  # SidecarProcess would make it itself: start serve directly
    path = directory / "events.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuscope", "serve", "--listen", "127.0.0.1:0", "--socket", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: os.path.lexists(path), 20, "os.path.lexists(path)")
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_symlink_to_a_stale_socket_is_refused(short_tmp: Path) -> None:
    """A stale socket would be replaced; one reached through a symlink must not be (the sidecar would
    otherwise follow the link, or delete it, wherever it points)."""
    target = short_tmp / "elsewhere.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stale.bind(str(target))
    stale.close()
    link = short_tmp / "events.sock"
    link.symlink_to(target)
    proc = serve(link)
    assert proc.returncode == 1 and "not a socket" in proc.stderr, proc.stderr
    assert link.is_symlink() and stat.S_ISSOCK(os.lstat(target).st_mode)
