"""``[server] tls_cert`` / ``tls_key``: the files checked when the config is read, so that a wrong
pair is one line at ``forge serve --check-config`` (or a refused reload), not a traceback from
uvicorn at start."""

from __future__ import annotations

from pathlib import Path

__all__ = ["tls_pair_problem"]


class _Encrypted(Exception):
    """The key asked for a password: forge has none to give (and must not prompt for one)."""


def _no_password() -> str:
    raise _Encrypted


def tls_pair_problem(cert: Path, key: Path) -> tuple[str, str] | None:
    """``(key, message)`` naming the ``[server]`` key at fault and why, or None when ``cert`` is a
    PEM certificate (chain) and ``key`` its unencrypted private key, both readable."""
    import ssl  # only a config with TLS pays for it (every CLI command reads the config)

    for name, path in (("tls_cert", cert), ("tls_key", key)):
        try:
            path.read_bytes()
        except OSError as exc:
            return name, f"{name} {str(path)!r} cannot be read: {exc.strerror or exc}"
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=str(cert))
    except ssl.SSLError:
        return "tls_cert", f"tls_cert {str(cert)!r} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(str(cert), str(key), password=_no_password)
    except _Encrypted:
        return "tls_key", f"tls_key {str(key)!r} is encrypted: forge needs it without a passphrase"
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            return "tls_key", f"tls_key {str(key)!r} is not the private key of tls_cert {str(cert)!r}"
        return "tls_key", f"tls_key {str(key)!r} holds no PEM private key (-----BEGIN … PRIVATE KEY-----)"
    return None
