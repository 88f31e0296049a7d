"""Speculative decoding through a real ``forge serve`` and the real llama-server: SmolLM2-135M as
its own draft (the same vocabulary, so it drafts, and greedy drafts are mostly accepted).

The acceptance counters on ``/metrics`` come from the answers' ``timings`` (``draft_n``,
``draft_n_accepted``), streamed and whole; the page's throughput API gives the rate; the draft's
own allocations are in the child's ledger, next to the estimate's draft part. The same child shows
the ``tools`` capability from its ``/props``: a ``--chat-template-file`` with tools makes SmolLM2
(whose GGUF template has none) a tools model once it runs."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from tests.support.service import FAST, model_section, running_service, write_config
from tests.support.tiny_gguf import TOOLS_TEMPLATE

PROMPT = {"role": "user", "content": "Count from 1 to 30, separated by commas."}


def _counter(text: str, name: str, model: str) -> float:
    m = re.search(rf'^{name}\{{model="{model}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def _caps(c: httpx.Client, name: str) -> list[str]:
    (entry,) = [m for m in c.get("/v1/models").json()["data"] if m["id"] == name]
    caps: list[str] = entry.get("capabilities", [])
    return caps


def test_smollm2_drafting_for_itself_shows_its_acceptance_rate(
    tmp_path: Path, smollm2_path: Path, llama_server_bin: Path
) -> None:
    template = tmp_path / "tools.jinja"
    template.write_text(TOOLS_TEMPLATE)
    section = model_section(
        "chat",
        smollm2_path,
        draft=str(smollm2_path),
        draft_max=8,
        parallel=1,
        args=["--threads", "1", "--chat-template-file", str(template)],
    )
    cfg = write_config(tmp_path / "forge.toml", FAST + section)
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc, svc.client() as c:
        assert "tools" not in _caps(c, "chat")  # before the load: SmolLM2's own template has none
        whole = {"model": "chat", "messages": [PROMPT], "max_tokens": 48, "temperature": 0}
        r = c.post("/v1/chat/completions", json=whole)
        assert r.status_code == 200, r.text
        timings = r.json()["timings"]
        assert timings["draft_n"] > 0 and 0 < timings["draft_n_accepted"] <= timings["draft_n"]
        with c.stream("POST", "/v1/chat/completions", json={**whole, "stream": True}) as s:
            assert s.status_code == 200
            streamed = "".join(s.iter_text())
        assert '"draft_n"' in streamed

        metrics = c.get("/metrics").text
        drafted = _counter(metrics, "forge_draft_tokens_total", "chat")
        accepted = _counter(metrics, "forge_draft_accepted_total", "chat")
        assert drafted > timings["draft_n"]  # both answers counted
        assert 0 < accepted <= drafted
        assert accepted / drafted > 0.5, (accepted, drafted)  # the model agrees with itself, greedy

        rates = c.get("/api/throughput").json()["models"]["chat"]
        assert rates["draft_tokens"] == drafted and rates["draft_accepted"] == accepted
        assert rates["draft_acceptance"] == round(accepted / drafted, 4)

        # The draft is in the estimate: it agrees with what the child logged, both loads together.
        memory = svc.model("chat")["memory"]
        estimated, actual = memory["estimated_bytes"]["cpu"], memory["actual_bytes"]["cpu"]
        assert abs(actual - estimated) < 0.1 * actual, memory
        assert "tools" in _caps(c, "chat")  # the running child's template (its /props) says so
        log = c.get("/api/models/chat/logs").text
        assert "adding speculative implementation 'draft-simple'" in log
