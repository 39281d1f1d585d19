"""The webhook ingress's TLS certificate follows its Secret's files: a renewal is served without a restart."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed
from tests.helpers.session import SESSION_ID


def _pair(directory: Path, name: str) -> tuple[bytes, bytes]:
    """A self-signed certificate for 127.0.0.1 and its key, PEM."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "1", "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert.read_bytes(), key.read_bytes()


class SecretVolume:
    """Files laid out as the kubelet lays out a mounted Secret: ``tls.crt -> ..data/tls.crt``, ``..data`` a
    symlink to a timestamped directory, swapped in one rename when the Secret changes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self.version = 0

    def write(self, cert: bytes, key: bytes) -> None:
        self.version += 1
        data = self.root / f"..v{self.version}"
        data.mkdir()
        (data / "tls.crt").write_bytes(cert)
        (data / "tls.key").write_bytes(key)
        (self.root / "..data_tmp").symlink_to(data.name)
        os.replace(self.root / "..data_tmp", self.root / "..data")
        for name in ("tls.crt", "tls.key"):
            if not (self.root / name).is_symlink():
                (self.root / name).symlink_to(f"..data/{name}")


def _served(port: int) -> bytes:
    """The certificate the ingress presents to a new connection (DER)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw) as tls:
        return tls.getpeercert(binary_form=True) or b""


def _der(pem: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.decode())


def test_a_renewed_certificate_is_served_without_a_restart(
        testbed: TestBed, testbed_root: Path, namespace: str, tmp_path: Path) -> None:
    first, second = _pair(tmp_path, "hooks-1"), _pair(tmp_path, "hooks-2")
    volume = SecretVolume(tmp_path / "tls")
    volume.write(*first)
    port = procs.free_port()
    log = testbed_root / "logs" / f"webhooks-tls-{namespace}.log"
    process = procs.ManagedProcess(
        "webhooks-tls", [sys.executable, "-m", "durablerun_operator.ingress", "--namespace", namespace,
                         "--address", "127.0.0.1", "--port", str(port), "--metrics-port", "0",
                         "--tls-cert", str(volume.root / "tls.crt"), "--tls-key", str(volume.root / "tls.key"),
                         "--tls-reload-seconds", "0.2"],
        log_path=log, env=testbed.env(), testbed_id=SESSION_ID)
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE

    def healthy() -> bool:
        process.check_alive()
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=2, context=insecure) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def serves(pem: bytes) -> bool:
        return healthy() and _served(port) == _der(pem)

    try:
        procs.wait_for(healthy, timeout=30, what="the ingress's /healthz over TLS")
        assert _served(port) == _der(first[0])

        volume.write(*second)  # cert-manager renewed it; the kubelet swapped the files
        procs.wait_for(lambda: serves(second[0]), timeout=15, what="the renewed certificate served")

        # A pair that does not go together (another writer mid-way): the renewed one stays served.
        volume.write(first[0], second[1])
        procs.wait_for(lambda: "do not load, still serving the previous ones" in log.read_text(), timeout=15,
                       what="the ingress saying it kept its certificate")
        assert serves(second[0])

        volume.write(*first)  # and the next good pair is served again
        procs.wait_for(lambda: serves(first[0]), timeout=15, what="the next certificate served")
        process.check_alive()
        assert "BEGIN" not in log.read_text()  # no key material in the log
    finally:
        process.stop()


def test_a_certificate_that_does_not_load_at_start_says_so(testbed: TestBed, namespace: str, tmp_path: Path) -> None:
    cert, _ = _pair(tmp_path, "hooks-1")
    _, other_key = _pair(tmp_path, "hooks-2")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(other_key)
    result = subprocess.run([sys.executable, "-m", "durablerun_operator.ingress", "--namespace", namespace,
                             "--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key")],
                            env=testbed.env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result
    assert "do not load" in result.stderr
