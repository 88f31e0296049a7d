"""Ollama API ⇄ llama-server requests and responses, as pure functions (no I/O).

The Ollama API is the one dialect llama-server does not speak, so it is the one place the gateway
translates: ``/api/chat`` and ``/api/generate`` become llama-server's ``/v1/chat/completions``
(which applies the model's chat template and parses tool calls and reasoning), or the native
``/completion`` / ``/infill`` for ``raw`` prompts and fill-in-the-middle (``suffix``); embeddings
go to ``/v1/embeddings``. Replies come back in Ollama's shape: one JSON object, or NDJSON lines
ending in a ``"done": true`` line with durations in nanoseconds (Ollama's units).

Request fields are mapped, never silently dropped when they matter: ``options`` become llama-server
sampling parameters, ``format`` becomes ``response_format`` / ``json_schema``, ``tools`` pass
through (Ollama's tool format is OpenAI's), ``think`` becomes ``chat_template_kwargs.
enable_thinking``. A value of the wrong type is a 400 naming the field.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..._errors import UsageError
from ..proxy._ingress import Target as ChildRequest

__all__ = [
    "ChatStream",
    "Target",
    "chat_reply",
    "chat_target",
    "embed_target",
    "generate_reply",
    "generate_target",
    "keep_alive_seconds",
    "native_piece",
    "now_iso",
]

#: Ollama ``options`` → llama-server parameter (same meaning; ``num_predict`` handled apart).
_OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "seed": "seed",
    "stop": "stop",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "mirostat": "mirostat",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
    "num_keep": "n_keep",
}
#: Options that are the loader's business in Ollama (set per model in forge.toml here): accepted
#: and ignored, so that clients which always send them keep working.
_LOAD_OPTIONS = frozenset(
    {
        "num_gpu", "main_gpu", "num_thread", "num_batch", "use_mmap", "use_mlock", "numa", "low_vram",
        "f16_kv", "vocab_only", "logits_all", "embedding_only", "penalize_newline", "tfs_z",
    }
)  # fmt: skip


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Target(ChildRequest):
    """Where a translated request goes: the llama-server path, its JSON body (the ingress's
    :class:`~..proxy._ingress.Target`), and what Ollama's own rules check."""

    num_ctx: int | None = None  # checked against the served context before sending
    keep_alive: float | None = None  # seconds; None: not given
    kind: str = "chat"  # chat | native | embed | embeddings


# -- requests ---------------------------------------------------------------------------------------


def _options(body: dict[str, Any], payload: dict[str, Any]) -> int | None:
    """Map ``options`` into ``payload``; returns ``num_ctx`` (checked later, not sent)."""
    opts = body.get("options") or {}
    if not isinstance(opts, dict):
        raise UsageError('"options" must be an object', hint='e.g. "options": {"temperature": 0.2}')
    for key, value in opts.items():
        if value is None:
            continue
        if key in _OPTIONS:
            payload[_OPTIONS[key]] = value
        elif key == "num_predict":
            if not isinstance(value, int) or isinstance(value, bool):
                raise UsageError(
                    '"options.num_predict" must be an integer', hint="e.g. 128, or -1 for no limit"
                )
            if value >= 0:
                payload["max_tokens"] = value  # -1 (no limit) and -2 (fill the context): leave unset
        elif key not in ("num_ctx", *_LOAD_OPTIONS):
            raise UsageError(
                f'unknown option "options.{key}"',
                hint="see https://github.com/ollama/ollama/blob/main/docs/modelfile.md#valid-parameters-and-values",
            )
    num_ctx = opts.get("num_ctx")
    if num_ctx is not None and (not isinstance(num_ctx, int) or isinstance(num_ctx, bool) or num_ctx <= 0):
        raise UsageError('"options.num_ctx" must be a positive integer', hint="e.g. 4096")
    return num_ctx


def _format(fmt: Any, payload: dict[str, Any], *, native: bool) -> None:
    if fmt in (None, ""):
        return
    if fmt == "json":
        schema: dict[str, Any] = {"type": "object"}
    elif isinstance(fmt, dict):
        schema = fmt
    else:
        raise UsageError('"format" must be "json" or a JSON schema object', hint='e.g. "format": "json"')
    if native:
        payload["json_schema"] = schema
    elif fmt == "json":
        payload["response_format"] = {"type": "json_object"}
    else:
        payload["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "format", "schema": schema},
        }


def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's ``keep_alive``: seconds (number), a Go duration (``"5m"``, ``"1h30m"``), negative = forever."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            pass
        parts = re.findall(r"(-?\d+(?:\.\d+)?)(ms|h|m|s)", text)
        if parts and "".join(a + b for a, b in parts) == text.replace(" ", ""):
            scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
            return sum(float(n) * scale[u] for n, u in parts)
    raise UsageError(f'"keep_alive" {value!r} is not a duration', hint='e.g. "5m", "1h", 300, 0 or -1')


def _images(images: Any) -> list[dict[str, Any]]:
    if not images:
        return []
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise UsageError('"images" must be a list of base64 strings', hint="encode each image as base64")
    return [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{i}"}} for i in images]


def _message(m: Any) -> dict[str, Any]:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise UsageError(
            'each of "messages" must be an object with a "role"', hint='{"role": "user", "content": "…"}'
        )
    out: dict[str, Any] = {"role": m["role"]}
    content = m.get("content") or ""
    images = _images(m.get("images"))
    out["content"] = [{"type": "text", "text": content}, *images] if images else content
    if m.get("thinking"):
        out["reasoning_content"] = m["thinking"]
    calls = m.get("tool_calls")
    if calls:
        out["tool_calls"] = [
            {
                "id": c.get("id") or f"call_{i}",
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": json.dumps(c["function"].get("arguments") or {}),
                },
            }
            for i, c in enumerate(calls)
        ]
    if m.get("tool_name"):
        out["name"] = m["tool_name"]
    if m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    return out


def _think(think: Any, payload: dict[str, Any]) -> None:
    if think is None:
        return
    if not isinstance(think, bool | str):
        raise UsageError(
            '"think" must be true, false or "low" / "medium" / "high"', hint='e.g. "think": true'
        )
    enabled = think if isinstance(think, bool) else think.lower() not in ("", "false", "none")
    payload.setdefault("chat_template_kwargs", {})["enable_thinking"] = enabled
    if isinstance(think, str) and enabled:
        payload["reasoning_effort"] = think.lower()


def chat_target(body: dict[str, Any], model: str) -> Target:
    messages = body.get("messages") or []
    if not isinstance(messages, list):
        raise UsageError('"messages" must be a list', hint='[{"role": "user", "content": "…"}]')
    payload: dict[str, Any] = {"model": model, "messages": [_message(m) for m in messages]}
    num_ctx = _options(body, payload)
    _format(body.get("format"), payload, native=False)
    _think(body.get("think"), payload)
    if body.get("tools"):
        payload["tools"] = body["tools"]
    stream = body.get("stream", True) is not False  # Ollama streams unless told not to
    payload["stream"] = stream
    if stream:
        payload["stream_options"] = {"include_usage": True}
    return Target(
        "/v1/chat/completions",
        payload,
        num_ctx=num_ctx,
        keep_alive=keep_alive_seconds(body.get("keep_alive")),
    )


def generate_target(body: dict[str, Any], model: str) -> Target:
    prompt = body.get("prompt") or ""
    if not isinstance(prompt, str):
        raise UsageError('"prompt" must be a string', hint='e.g. "prompt": "Why is the sky blue?"')
    keep = keep_alive_seconds(body.get("keep_alive"))
    stream = body.get("stream", True) is not False
    suffix = body.get("suffix")
    if suffix or body.get("raw"):
        payload: dict[str, Any] = {"model": model, "stream": stream}
        if suffix:  # fill-in-the-middle: llama-server's /infill uses the model's FIM tokens
            payload.update({"input_prefix": prompt, "input_suffix": suffix, "prompt": ""})
            path = "/infill"
        else:
            payload["prompt"] = prompt
            path = "/completion"
        num_ctx = _options(body, payload)
        if "max_tokens" in payload:
            payload["n_predict"] = payload.pop("max_tokens")
        _format(body.get("format"), payload, native=True)
        return Target(path, payload, num_ctx=num_ctx, keep_alive=keep, kind="native")
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": body["system"]})
    messages.append({"role": "user", "content": prompt, "images": body.get("images")})
    chat: dict[str, Any] = {
        k: body[k] for k in ("options", "format", "think", "keep_alive", "stream") if k in body
    }
    target = chat_target({**chat, "messages": messages}, model)
    target.keep_alive = keep
    return target


def embed_target(body: dict[str, Any], model: str, *, legacy: bool) -> Target:
    """``/api/embed`` (``input``: str or list) or the older ``/api/embeddings`` (``prompt``)."""
    key = "prompt" if legacy else "input"
    value = body.get(key)
    if isinstance(value, str):
        inputs: list[str] = [value]
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        inputs = value
    else:
        raise UsageError(
            f'"{key}" must be a string' + ("" if legacy else " or a list of strings"),
            hint='e.g. "input": "hello"',
        )
    payload: dict[str, Any] = {"model": model, "input": inputs}
    if body.get("dimensions"):
        payload["dimensions"] = body["dimensions"]
    num_ctx = _options(body, {})
    return Target(
        "/v1/embeddings",
        payload,
        num_ctx=num_ctx,
        keep_alive=keep_alive_seconds(body.get("keep_alive")),
        kind="embeddings" if legacy else "embed",
    )


# -- replies ----------------------------------------------------------------------------------------


def _ns(ms: Any) -> int:
    return int(float(ms or 0) * 1e6)


def _stats(timings: dict[str, Any] | None, usage: dict[str, Any] | None, started: float) -> dict[str, Any]:
    t = timings or {}
    u = usage or {}
    return {
        "total_duration": int((time.perf_counter() - started) * 1e9),
        "load_duration": 0,
        # usage counts the whole prompt; timings.prompt_n only the part not found in the cache
        "prompt_eval_count": int(u.get("prompt_tokens") or (t.get("prompt_n", 0) + t.get("cache_n", 0)) or 0),
        "prompt_eval_duration": _ns(t.get("prompt_ms")),
        "eval_count": int(t.get("predicted_n", u.get("completion_tokens", 0)) or 0),
        "eval_duration": _ns(t.get("predicted_ms")),
    }


def _done_reason(reason: Any) -> str:
    return "length" if reason == "length" else "stop"


def _tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for c in calls:
        fn = c.get("function") or {}
        args = fn.get("arguments") or "{}"
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            parsed = {"_raw": args}  # the model wrote invalid JSON: keep it visible, don't crash
        out.append({"id": c.get("id"), "function": {"name": fn.get("name", ""), "arguments": parsed}})
    return out


def _ollama_message(msg: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
    if msg.get("reasoning_content"):
        out["thinking"] = msg["reasoning_content"]
    if msg.get("tool_calls"):
        out["tool_calls"] = _tool_calls(msg["tool_calls"])
    return out


def chat_reply(data: dict[str, Any], model: str, started: float, *, generate: bool) -> dict[str, Any]:
    """One non-streamed OpenAI chat completion → Ollama's ``/api/chat`` or ``/api/generate`` reply."""
    choice = (data.get("choices") or [{}])[0]
    msg = _ollama_message(choice.get("message") or {})
    head: dict[str, Any] = {"model": model, "created_at": now_iso()}
    if generate:
        head["response"] = msg["content"]
        if "thinking" in msg:
            head["thinking"] = msg["thinking"]
    else:
        head["message"] = msg
    return {
        **head,
        "done": True,
        "done_reason": _done_reason(choice.get("finish_reason")),
        **_stats(data.get("timings"), data.get("usage"), started),
    }


def generate_reply(data: dict[str, Any], model: str, started: float) -> dict[str, Any]:
    """One native ``/completion`` or ``/infill`` result → Ollama's ``/api/generate`` reply."""
    return {
        "model": model,
        "created_at": now_iso(),
        "response": data.get("content") or "",
        "done": True,
        "done_reason": "length" if data.get("stop_type") == "limit" else "stop",
        **_stats(data.get("timings"), {"prompt_tokens": data.get("tokens_evaluated")}, started),
    }


def native_piece(data: dict[str, Any], model: str, started: float) -> dict[str, Any]:
    """One streamed native chunk → an NDJSON line (the last one, ``stop: true``, carries stats)."""
    if data.get("stop"):
        return generate_reply(data, model, started)
    return {"model": model, "created_at": now_iso(), "response": data.get("content") or "", "done": False}


@dataclass
class ChatStream:
    """Streamed OpenAI chat chunks → Ollama NDJSON lines.

    Tool-call fragments are gathered and sent whole in one line at the end (Ollama clients expect
    complete ``arguments`` objects, OpenAI streams them as string pieces).
    """

    model: str
    started: float
    generate: bool = False
    _calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    _reason: str | None = None
    _timings: dict[str, Any] | None = None
    _usage: dict[str, Any] | None = None

    def _line(self, content: str, thinking: str | None, done: bool) -> dict[str, Any]:
        line: dict[str, Any] = {"model": self.model, "created_at": now_iso()}
        if self.generate:
            line["response"] = content
            if thinking:
                line["thinking"] = thinking
        else:
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                msg["thinking"] = thinking
            line["message"] = msg
        line["done"] = done
        return line

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        if chunk.get("timings"):
            self._timings = chunk["timings"]
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        out = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            for frag in delta.get("tool_calls") or []:
                slot = self._calls.setdefault(
                    int(frag.get("index", 0)), {"function": {"name": "", "arguments": ""}}
                )
                if frag.get("id"):
                    slot["id"] = frag["id"]
                fn = frag.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            if delta.get("content") or delta.get("reasoning_content"):
                out.append(self._line(delta.get("content") or "", delta.get("reasoning_content"), False))
            if choice.get("finish_reason"):
                self._reason = choice["finish_reason"]
        return out

    def finish(self) -> dict[str, Any]:
        last = self._line("", None, True)
        if self._calls and not self.generate:
            last["message"]["tool_calls"] = _tool_calls([self._calls[i] for i in sorted(self._calls)])
        last["done_reason"] = _done_reason(self._reason)
        last.update(_stats(self._timings, self._usage, self.started))
        return last
