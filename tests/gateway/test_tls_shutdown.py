"""SIGTERM to a real `forge serve` that serves HTTPS while a client holds an idle keep-alive
connection: it exits in about a second, as it does over plain HTTP.

Closing a TLS connection politely sends ``close_notify`` and then waits for the peer's; a pooling
client (httpx under the OpenAI SDK) does not read an idle connection, so that answer never comes
and the connection stayed open until the drain period ran out. The children are the FAKE
llama-server (``FORGE_LLAMA_SERVER``): TLS is the gateway's, between the client and `forge serve`.
"""

from __future__ import annotations

import signal
import ssl
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.service import running_service, write_config
from tests.support.tls import client_context, self_signed

#: A long drain period: a shutdown that waited on the idle connection could not pass the bound.
CONFIG = """
[supervisor]
drain_timeout = 40
stop_timeout = 5

[models.m]
path = "{path}"
gpu = "cpu"
preload = true
"""
EXIT_S = 6.0


def _hold_idle_connection(client: str, url: str, trust: ssl.SSLContext | bool, stack: ExitStack) -> None:
    """One answer through ``client``, whose connection then waits in its pool, open and idle."""
    if client == "openai":  # the SDK's own HTTP client (its default, as an application has it)
        http = stack.enter_context(openai.DefaultHttpxClient(verify=trust))
        oa = openai.OpenAI(base_url=f"{url}/v1", api_key="none", http_client=http, max_retries=0)
        answer = oa.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert answer.choices[0].message.content
    else:
        c = stack.enter_context(httpx.Client(base_url=url, verify=trust, timeout=30))
        r = c.post(
            "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(("tls", "client"), [(True, "openai"), (True, "httpx"), (False, "openai")])
def test_sigterm_with_an_idle_keep_alive_connection_exits_promptly(
    tls: bool, client: str, tmp_path: Path, tiny_gguf: Path, fake_bin: Path
) -> None:
    server = ""
    trust: ssl.SSLContext | bool = True
    if tls:
        cert, key = self_signed(tmp_path / "tls")
        server = f'[server]\ntls_cert = "{cert}"\ntls_key = "{key}"\n'
        trust = client_context(cert)
    config = write_config(tmp_path / "forge.toml", server + CONFIG.format(path=tiny_gguf))
    with running_service(config, tmp_path / "state", fake_bin, verify=trust) as svc, ExitStack() as stack:
        assert svc.url.startswith("https://" if tls else "http://"), svc.url
        _hold_idle_connection(client, svc.url, trust, stack)
        t0 = time.monotonic()
        svc.proc.send_signal(signal.SIGTERM)
        rc = svc.proc.wait(timeout=60)
        took = time.monotonic() - t0
        stderr = svc.stderr_text()
        assert rc == 0, stderr[-3000:]
        assert took < EXIT_S, f"shutdown took {took:.1f} s:\n{stderr[-2000:]}"
        assert "Traceback" not in stderr, stderr[-3000:]
