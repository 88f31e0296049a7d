"""Self-signed certificates for the TLS tests, made by the ``openssl`` command (the ``cryptography``
package is not among the dev tools). Each names ``localhost`` and ``127.0.0.1``, where tests reach
the service, and is valid for a day."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

__all__ = ["client_context", "self_signed"]


def self_signed(folder: Path, name: str = "forge") -> tuple[Path, Path]:
    """``(cert, key)``: a new P-256 key and its self-signed certificate under ``folder``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    return cert, key


def client_context(cert: Path) -> ssl.SSLContext:
    """What a careful client does with a self-signed server: trust that certificate, and only it."""
    return ssl.create_default_context(cafile=str(cert))
