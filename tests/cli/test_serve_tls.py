"""``[server] tls_cert`` / ``tls_key`` on a real `forge serve`: HTTPS on the main port and the
Ollama port, checked by real clients (the OpenAI SDK, the Ollama client) trusting the self-signed
certificate made for the test; the start-up lines and the printed examples say https; the CLI
finds the service over TLS and requires the certificate it was started with; and keys served
over plain HTTP on a network address are warned about. The children are the FAKE llama-server
(``FORGE_LLAMA_SERVER``): TLS is the gateway's, between the client and `forge serve`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from rocmforge_supervisor.client import pinned_context
from tests.support.service import FORGE, Service, running_service, write_config
from tests.support.tls import client_context, self_signed

KEY = "k-secret"
MODEL = '[models.m]\npath = "{path}"\n'


def _cli(svc: Service, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FORGE_STATE_DIR=str(svc.state_dir), FORGE_API_KEY=KEY)
    return subprocess.run([*FORGE, *args], capture_output=True, text=True, env=env, timeout=120)


def test_https_on_both_ports_with_real_clients_and_the_cli(
    tmp_path: Path, tiny_gguf: Path, fake_bin: Path
) -> None:
    cert, key = self_signed(tmp_path / "tls")
    server = f'[server]\napi_key = "{KEY}"\ntls_cert = "{cert}"\ntls_key = "{key}"\nollama_port = 0\n'
    config = write_config(tmp_path / "forge.toml", server + MODEL.format(path=tiny_gguf))
    trust = client_context(cert)
    with running_service(config, tmp_path / "state", fake_bin, api_key=KEY, verify=trust) as svc:
        assert svc.url.startswith("https://127.0.0.1:"), svc.url
        err = svc.stderr_text()
        assert (
            f"forge serve listening on {svc.url} (TLS, certificate {cert}; OpenAI base URL {svc.url}/v1)"
            in err
        )
        assert f"curl -s --cacert {cert} {svc.url}/v1/chat/completions" in err  # the printed example
        assert f'verify="{cert}"' in err and "plain HTTP" not in err

        with httpx.Client(verify=trust) as http:
            client = openai.OpenAI(base_url=f"{svc.url}/v1", api_key=KEY, http_client=http, max_retries=0)
            answer = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert answer.choices[0].message.content
            streamed = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
            )
            assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        # A client that trusts only the public CAs refuses the self-signed certificate; plain HTTP
        # to the TLS port gets no answer.
        with pytest.raises(openai.APIConnectionError):
            openai.OpenAI(base_url=f"{svc.url}/v1", api_key=KEY, max_retries=0).models.list()
        with pytest.raises(httpx.HTTPError):
            httpx.get(svc.url.replace("https://", "http://") + "/health", timeout=10)

        info = json.loads((svc.state_dir / "service.json").read_text())
        assert info["url"] == svc.url and info["tls_cert"] == str(cert)
        ollama_url = f"https://127.0.0.1:{info['ollama_port']}"
        assert f"Ollama API also on {ollama_url} (server.ollama_port)" in err
        with ollama.Client(host=ollama_url, verify=trust, headers={"Authorization": f"Bearer {KEY}"}) as oc:
            assert [m.model for m in oc.list().models] == ["m"]
            reply = oc.chat(
                model="m", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 4}
            )
            assert reply.message.content

        # The CLI finds the service by its service.json, over https, checking the certificate.
        ps = _cli(svc, "ps", "--json")
        assert ps.returncode == 0 and [r["name"] for r in json.loads(ps.stdout)["models"]] == ["m"], ps.stderr
        prompt = _cli(svc, "load", "m", "-p", "hi", "-n", "4")
        assert prompt.returncode == 0 and "tok" in prompt.stdout, prompt.stderr
        assert f"using m on the forge service at {svc.url}" in prompt.stderr
        # A service that presents another certificate than the one it was started with is refused.
        other, _ = self_signed(tmp_path / "other", "other")
        (svc.state_dir / "service.json").write_text(json.dumps({**info, "tls_cert": str(other)}))
        refused = _cli(svc, "ps")
        assert refused.returncode == 1 and "did not present a trusted certificate" in refused.stderr, (
            refused.stderr
        )
        assert "Traceback" not in refused.stderr


def test_keys_over_plain_http_on_a_network_address_are_warned(
    tmp_path: Path, tiny_gguf: Path, fake_bin: Path
) -> None:
    warning = "serves plain HTTP: API keys, prompts and answers cross it unencrypted"
    plain = write_config(tmp_path / "plain.toml", f'[server]\nhost = "0.0.0.0"\napi_key = "{KEY}"\n')
    with running_service(plain, tmp_path / "plain", fake_bin, api_key=KEY) as svc:
        err = svc.stderr_text()
        assert warning in err and "set server.tls_cert and server.tls_key" in err
        assert f"forge serve listening on {svc.url} (plain HTTP, no TLS;" in err
    cert, key = self_signed(tmp_path / "tls")
    tls = write_config(
        tmp_path / "tls.toml",
        f'[server]\nhost = "0.0.0.0"\napi_key = "{KEY}"\ntls_cert = "{cert}"\ntls_key = "{key}"\n',
    )
    # Reached at 0.0.0.0, which the certificate does not name: trust that very certificate instead.
    with running_service(
        tls, tmp_path / "tls-state", fake_bin, api_key=KEY, verify=pinned_context(cert)
    ) as svc:
        assert svc.url.startswith("https://0.0.0.0:") and warning not in svc.stderr_text()
