"""A client that leaves is cancelled upstream at once, in every dialect, whole or streamed.

Through `forge serve` on the real llama-server (SmolLM2-135M, ``--ignore-eos`` so that every
request generates until its length, which is far beyond the client's patience): a client gives up
on a whole request after a short read timeout (httpx's ``ReadTimeout``; the connection closes), or
leaves a stream after its first bytes. Then, within a bound: the model's ``in_flight`` is back to
0, its child stops computing (its CPU time stops growing: llama-server cancelled the task when
the gateway closed the upstream connection), the next request is answered at once (nothing
abandoned holds the child's one slot or its KV cache), and the activity row says ``cancelled``.
Before, a whole request ran to its end with nobody waiting for it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.support.service import Service, model_section, running_service, wait_for, write_config

HELLO = [{"role": "user", "content": "Tell me a very long story about a lighthouse."}]
#: Far more than a client here waits for (minutes on two CPU cores); the context holds it.
LONG = 3500
#: (route, body, streamed) per dialect and route.
CASES: dict[str, tuple[str, dict[str, Any], bool]] = {
    "openai": ("/v1/chat/completions", {"messages": HELLO, "max_tokens": LONG}, False),
    "anthropic": ("/v1/messages", {"messages": HELLO, "max_tokens": LONG}, False),
    "ollama-chat": (
        "/api/chat",
        {"messages": HELLO, "stream": False, "options": {"num_predict": LONG}},
        False,
    ),
    "ollama-generate": (
        "/api/generate",
        {"prompt": "Once upon a time", "stream": False, "options": {"num_predict": LONG}},
        False,
    ),
    "openai-stream": ("/v1/chat/completions", {"messages": HELLO, "max_tokens": LONG, "stream": True}, True),
    "anthropic-stream": ("/v1/messages", {"messages": HELLO, "max_tokens": LONG, "stream": True}, True),
    "ollama-stream": ("/api/chat", {"messages": HELLO, "options": {"num_predict": LONG}}, True),
}
#: How long the client waits for a whole answer before it gives up.
PATIENCE = 2.0
#: How soon after the client left the slot must be back and the child idle.
BOUND = 10.0


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path, smollm2_path: Path
) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("client-gone")
    model = model_section(
        "smol", smollm2_path, ctx_size=4096, parallel=1, preload=True, args=["--ignore-eos"]
    )
    config = write_config(d / "forge.toml", model)
    with running_service(config, d / "state", llama_server_bin) as s:
        yield s


def _cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def _busy(child: psutil.Process, window: float = 0.5) -> bool:
    """Whether the child used more than a fifth of a core over ``window`` seconds (a generation
    keeps its threads spinning: well over a core on this machine)."""
    before = _cpu_seconds(child)
    time.sleep(window)  # the measuring window itself, not a wait for something to happen
    return _cpu_seconds(child) - before > 0.2 * window


def _leave(svc: Service, path: str, body: dict[str, Any], streamed: bool, rid: str) -> None:
    headers = {"X-Request-ID": rid}
    if streamed:
        with (
            httpx.Client(base_url=svc.url, timeout=60) as c,
            c.stream("POST", path, json=body, headers=headers) as r,
        ):
            assert r.status_code == 200
            seen = 0
            for chunk in r.iter_raw():
                seen += len(chunk)
                if seen > 600:  # some tokens came: the client leaves
                    return
        raise AssertionError("the stream ended before the client left")
    timeout = httpx.Timeout(30, read=PATIENCE)
    with httpx.Client(base_url=svc.url, timeout=timeout) as c, pytest.raises(httpx.ReadTimeout):
        c.post(path, json=body, headers=headers)


def _row(svc: Service, rid: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        with svc.client() as c:
            rows = c.get("/api/activity", params={"limit": 50}).json()["activity"]
        return next((r for r in rows if r["request_id"] == rid), None)

    row: dict[str, Any] = wait_for(find, timeout=30, what=f"the activity row of {rid}")
    return row


@pytest.mark.parametrize("case", list(CASES))
def test_a_client_that_leaves_is_cancelled_upstream(svc: Service, case: str) -> None:
    path, body, streamed = CASES[case]
    (child,) = svc.llama_children()
    wait_for(lambda: not _busy(child), timeout=60, interval=0, what="the child idle before the case")
    rid = f"gone-{case}"
    _leave(svc, path, {"model": "smol", **body}, streamed, rid)
    left = time.monotonic()
    wait_for(lambda: svc.model("smol")["in_flight"] == 0, timeout=BOUND, what="in_flight back to 0")
    wait_for(lambda: not _busy(child), timeout=BOUND, interval=0, what="the child to stop computing")
    # Nothing abandoned is ahead of the next request at the child.
    with svc.client() as c:
        r = c.post("/v1/chat/completions", json={"model": "smol", "messages": HELLO, "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert time.monotonic() - left < 2 * BOUND
    row = _row(svc, rid)
    assert row["cancelled"], row
    if streamed:  # the stream had begun: its status stays, and it is charged what it produced
        assert row["status"] == 200 and row["completion_tokens"], row
    else:  # nothing was sent to the client
        assert row["status"] == 499 and row["error"] == "client_gone", row
