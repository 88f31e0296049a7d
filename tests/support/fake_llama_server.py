"""A FAKE llama-server: a small stdlib-only script that the tests run as the child instead of the
compiled binary, to drive the supervisor's state machine in milliseconds.

It is not llama.cpp and computes nothing. It speaks just enough of llama-server's surface for the
supervisor: it takes llama-server's command line (``--host``, ``--port``, ``--api-key-file``, the
rest ignored), prints the ``main: server is listening on http://H:P - starting the main loop``
line, answers ``/health`` (503 while "loading", then 200), and streams SSE for
``/v1/chat/completions`` and ``/v1/completions`` (a few ``data:`` chunks, then ``[DONE]``), and
``/v1/messages`` in Anthropic's shape (``message_start`` … ``message_stop`` events when streamed).

Faults on command, through extra arguments a test puts in a model's ``args`` (so each model of one
supervisor can behave differently):

``--fake-load-seconds S``   stay "loading" (503, no listening line yet) for S seconds
``--fake-crash-after S``    exit with status 1 S seconds after becoming ready
``--fake-refuse``           print llama.cpp's "failed to load model" error and exit 1: at once, or
                           after ``--fake-load-seconds`` when given (a load that fails midway)
``--fake-token-delay S``    wait S seconds between streamed chunks (a slow, held stream)
``--fake-chunks N``         stream N chunks (default 3)
``--fake-die SIG``          die of signal SIG (``SIGILL``…) at start, before listening (a build
                           that uses an instruction this CPU lacks dies like this while loading)
``--fake-die-on-request SIG``  die of SIG on the first completion request (the AMX crash at the
                           pinned llama.cpp: a fault in the first matrix multiply of a token)
``--fake-first-token-delay S``  wait S seconds before answering a completion request at all: the
                           real server sends its response head with the first result (a long
                           prompt's evaluation, a slot still busy), so the gateway sees silence
``--fake-error STATUS``     answer every completion request with llama-server's error body
                           (``{"error": {"code", "message", "type"}}``) and that status
``--fake-die-mid-stream N``  SIGKILL itself after sending N chunks of a stream (a crash while
                           generating: the client's stream breaks without its last event)
``--fake-linger-after-end S``  wait S seconds after a stream's last event before ending the
                           response (the gap in which a client that has read ``[DONE]`` closes)

A stream the client closes is noticed at the next write: the fake prints ``fake llama-server:
client closed the stream after N chunks`` and stops generating, as the real one cancels its task.

``--sleep-idle-seconds N`` (llama-server's own flag) makes ``/props`` say ``"is_sleeping": true``
after N seconds without a completion request, as the real one does once it freed the model.

The same two request faults through the environment, for callers that build the argv themselves
(the build self-test): ``FAKE_LLAMA_DIE_ON_REQUEST=SIG``, and ``FAKE_LLAMA_WORKS_WITH=FLAG`` for
"no fault when FLAG is on the command line" (``--no-repack``, the AMX workaround).
``FAKE_LLAMA_LOG`` holds extra lines (separated by a literal ``\\n``) printed at start: the buffer and
backend-module lines a real build prints, for what the self-test records.

``--fake-device-memory FILE=BYTES`` writes ``BYTES`` to ``FILE`` (``{pid}`` replaced by its pid)
before it listens: a per-process device memory file as the kernel keeps it (KFD's
``/sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id>``), in a copy of a fixture machine's sysfs.

``POST /slots/N?action=save|restore|erase`` with ``--slot-save-path DIR`` (``keep_context``)
writes, reads and empties a slot as llama-server does: the file holds the slot's tokens (100
bytes a token), the answer ``n_saved``/``n_restored``/``n_erased``; ``--fake-save-seconds S``
makes each save take S seconds after its file appears (a slow disk). Without ``--fake-slots`` an
empty slot saves ``FAKE_SLOT_TOKENS`` (7) made-up tokens, so that a planned stop has something.

``--fake-slots`` keeps the FAKE's model of each slot's KV cache (``_Slots``): a token is a word of
the chat (a ``<|role|>`` marker and the words of each message, then ``<|assistant|>``), a request
reuses the longest common prefix with its slot (``id_slot``, else the most similar idle slot, else
the least recently used), reported as ``timings.cache_n`` and
``usage.prompt_tokens_details.cached_tokens``, and leaves the slot holding its prompt and all but
the last generated token. ``GET /slots`` reports each slot's ``n_ctx``, ``is_processing`` and, once
it has run a task, ``id_task`` and ``n_prompt_tokens`` (what it holds now). With ``--kv-unified``
and more than one ``--parallel`` slot the slots share ``--ctx-size`` cells (default 4096), and the
FAKE purges as llama-server does when they run out: a request that does not fit empties idle
slots in slot order first (printing llama-server's ``try_clear_id: purging slot N with M
tokens``), a restore that does not fit is refused with its message (``No available space in KV
cache``); without it each slot has ``ctx_size / parallel`` cells of its own. A prompt as long as
its slot's context is llama-server's 400 ``exceed_context_size_error``.
``--fake-prompt-tokens N`` makes every chat prompt the same N tokens (default: its words; without
``--fake-slots`` every answer's ``usage.prompt_tokens`` is N, default 2);
``--fake-restore-noop`` (or ``FAKE_LLAMA_RESTORE_NOOP=1``, for the build self-test) makes a restore
answer as usual but leave the slot empty (llama.cpp #26676).
tests/gateway/test_conversation_tier.py checks the purge and the restore against the real server.

``/completion`` (llama-server's own route) answers ``{"content", "tokens_predicted"}`` (with
``timings.cache_n``, what its slot held, when sent with ``id_slot``: the self-test's restore check);
each finished request prints llama-server's ``print_timing`` line.

``--reranking`` (llama-server's own flag) makes it answer ``/v1/rerank``, ``/rerank`` and their
``…ing`` spellings in the Jina/Cohere shape (``{"results": [{"index", "relevance_score"}]}``, best
first, a made-up score per document); without it they are llama-server's 501 "Start it with
`--reranking`". ``--fake-tools-caps 0|1`` puts ``chat_template_caps.supports_tools`` in ``/props``,
as the real server reports what its chat template can do. ``--fake-tool-calls`` answers a chat
that sends ``tools`` (and does not end with a tool's result) with a FAKE call of its first tool,
``{"fake": "arg", "n": 1}``, its arguments streamed in three pieces (``finish_reason: tool_calls``).

``--version`` and ``--list-devices`` answer as a CPU-only build, so ``FORGE_LLAMA_SERVER`` may
point at the fake (a ``forge serve`` subprocess in the service tests).

A hang needs no flag: the test SIGSTOPs the process, as it would a real one.
The real-process tests under tests/process and tests/gateway are what prove the fake honest.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs


def _args(argv: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            name, eq, value = a.partition("=")
            if eq:
                out[name] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[name] = argv[i + 1]
                i += 1
            else:
                out[name] = ""
        i += 1
    return out


def _asks_tool(body: dict[str, object]) -> bool:
    """A chat with tools whose last message is not a tool's result (``--fake-tool-calls``)."""
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else {}
    return bool(body.get("tools")) and isinstance(last, dict) and last.get("role") != "tool"


def _name_process() -> None:
    """Show as ``llama-server`` in ps (and to the tests' no-orphans check and the stale sweep)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, b"llama-server", 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _die(name: str) -> None:
    """Die of signal ``name`` as a crashing binary does (no handler, no cleanup, no core file)."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.kill(os.getpid(), signal.Signals[name])  # Python leaves these signals at their default
    time.sleep(5)  # the signal arrives at once; never fall through
    os._exit(1)


class _Slots:
    """What each slot's KV cache holds, as token lists, kept the way llama-server keeps it (a
    FAKE's model of it: a token is a word of the prompt). A request reuses the longest common
    prefix of its prompt with its slot's tokens (``cache_n``) and leaves the slot holding its
    prompt and all but the last generated token. With ``--kv-unified`` and more than one slot the
    slots share ``--ctx-size`` cells: a request that does not fit empties idle slots in slot order
    first, as llama-server's ``try_clear_idle_slots`` does (``purging slot N with M tokens``); a
    restore that does not fit is refused with llama-server's message. Without it each slot has
    ``ctx_size / parallel`` cells of its own."""

    def __init__(self, parallel: int, n_ctx: int, unified: bool) -> None:
        self.parallel, self.n_ctx, self.unified = parallel, n_ctx, unified and parallel > 1
        self.slot_ctx = n_ctx if self.unified or parallel <= 1 else n_ctx // parallel
        self.held: dict[int, list[str]] = {i: [] for i in range(parallel)}
        self.task: dict[int, int] = {}  # the last task each slot ran (GET /slots' id_task)
        self.busy: set[int] = set()
        self.used: dict[int, int] = {i: 0 for i in range(parallel)}  # when each last ran (LRU)
        self.tasks = 0
        self.lock = threading.Lock()

    def report(self) -> list[dict[str, object]]:
        """``GET /slots``: ``n_prompt_tokens`` (what the slot holds) once it has run a task."""
        with self.lock:
            out: list[dict[str, object]] = []
            for i in range(self.parallel):
                row: dict[str, object] = {
                    "id": i,
                    "n_ctx": self.slot_ctx,
                    "speculative": False,
                    "is_processing": i in self.busy,
                }
                if i in self.task:
                    row |= {"id_task": self.task[i], "n_prompt_tokens": len(self.held[i])}
                out.append(row)
            return out

    def start(self, slot: object, prompt: list[str], n_gen: int) -> tuple[int, int] | tuple[int, str]:
        """A task for ``prompt`` (generating ``n_gen`` tokens) on ``slot`` (None: llama-server's
        own choice, the most similar idle slot, else the least recently used). ``(slot, cached)``;
        ``(status, message)`` when it cannot run (the caller answers the error)."""
        with self.lock:
            if len(prompt) >= self.slot_ctx:
                return 400, "the request exceeds the available context size, try increasing it"
            if isinstance(slot, int):
                chosen = slot
            else:
                idle = [i for i in range(self.parallel) if i not in self.busy] or list(range(self.parallel))
                similar = [i for i in idle if _common(self.held[i], prompt) > 0.1 * len(prompt)]
                chosen = (
                    max(similar, key=lambda i: _common(self.held[i], prompt))
                    if similar
                    else min(idle, key=lambda i: self.used[i])
                )
            cached = min(_common(self.held[chosen], prompt), len(prompt) - 1)
            need = len(prompt) + max(n_gen - 1, 0)
            if self.unified:
                others = sum(len(t) for i, t in self.held.items() if i != chosen)
                for i in range(self.parallel):
                    if others + need <= self.n_ctx:
                        break
                    if i != chosen and i not in self.busy and self.held[i]:
                        print(
                            f"srv  try_clear_id: purging slot {i} with {len(self.held[i])} tokens",
                            file=sys.stderr,
                            flush=True,
                        )
                        others -= len(self.held[i])
                        self.held[i] = []
                if others + need > self.n_ctx:
                    return 500, "Context size has been exceeded."
            self.tasks += 1
            self.task[chosen] = self.tasks
            self.busy.add(chosen)
            self.held[chosen] = self.held[chosen][:cached]
            return chosen, cached

    def done(self, slot: int, prompt: list[str], generated: list[str]) -> None:
        with self.lock:
            self.held[slot] = prompt + generated[:-1]
            self.busy.discard(slot)
            self.used[slot] = time.monotonic_ns()

    def restore(self, slot: int, tokens: list[str], noop: bool) -> str | None:
        """The slot holds ``tokens`` (``noop``: llama.cpp #26676, left empty); None, or why not."""
        with self.lock:
            self.held[slot] = []
            if len(tokens) > self.slot_ctx:
                return "Unable to restore slot: Restored prompt does not fit in the slot context"
            if self.unified and sum(len(t) for t in self.held.values()) + len(tokens) > self.n_ctx:
                return "Unable to restore slot: No available space in KV cache or invalid slot save file"
            self.held[slot] = [] if noop else list(tokens)
            return None

    def erase(self, slot: int) -> int:
        with self.lock:
            n, self.held[slot] = len(self.held[slot]), []
            return n


def _common(a: list[str], b: list[str]) -> int:
    """The length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _words(messages: object) -> list[str]:
    """A chat's prompt as the FAKE tokenizes it: a role marker and the words of each message, then
    the assistant's marker (the generation prompt)."""
    out: list[str] = []
    for m in messages if isinstance(messages, list) else []:
        if isinstance(m, dict):
            content = m.get("content")
            text = content if isinstance(content, str) else json.dumps(content)
            out += [f"<|{m.get('role')}|>", *text.split()]
    return [*out, "<|assistant|>"]


def _unified(argv: list[str]) -> bool:
    """``--kv-unified``/``-kvu`` on the command line, the last of it and its ``no`` form winning."""
    on = False
    for a in argv:
        if a in ("--kv-unified", "-kvu"):
            on = True
        elif a in ("--no-kv-unified", "-no-kvu"):
            on = False
    return on


def main() -> None:
    """llama-server's life, faked: parse, "load", listen, serve until a signal or a fault."""
    _name_process()
    if "--version" in sys.argv:  # as `forge` probes a binary: a CPU-only build
        print("version: 0 (build 0, commit 0fa4e)", file=sys.stderr, flush=True)
        return
    if "--list-devices" in sys.argv:
        print("Available devices:", flush=True)
        return
    opts = _args(sys.argv[1:])
    print(f"fake llama-server: model {opts.get('--model')}", file=sys.stderr, flush=True)
    for line in filter(None, os.environ.get("FAKE_LLAMA_LOG", "").split("\\n")):
        print(line, file=sys.stderr, flush=True)
    if "--fake-die" in opts:
        _die(opts["--fake-die"])
    if "--fake-device-memory" in opts:
        file, _, size = opts["--fake-device-memory"].rpartition("=")
        target = Path(file.replace("{pid}", str(os.getpid())))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"{int(size)}\n")
    die_on_request = opts.get("--fake-die-on-request") or os.environ.get("FAKE_LLAMA_DIE_ON_REQUEST")
    works_with = os.environ.get("FAKE_LLAMA_WORKS_WITH")
    if works_with and works_with in sys.argv:
        die_on_request = None
    if "--fake-refuse" in opts:
        time.sleep(float(opts.get("--fake-load-seconds", "0")))
        print(
            "llama_model_load: error loading model: failed to load model (fake refusal)",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)
    key = ""
    if opts.get("--api-key-file"):
        with open(opts["--api-key-file"]) as f:
            key = f.read().strip()
    host, port = opts.get("--host", "127.0.0.1"), int(opts["--port"])
    load_s = float(opts.get("--fake-load-seconds", "0"))
    token_delay = float(opts.get("--fake-token-delay", "0"))
    chunks = int(opts.get("--fake-chunks", "3"))
    first_token_delay = float(opts.get("--fake-first-token-delay", "0"))
    error_status = int(opts.get("--fake-error", "0"))
    die_mid_stream = int(opts.get("--fake-die-mid-stream", "-1"))
    linger_after_end = float(opts.get("--fake-linger-after-end", "0"))
    sleep_idle = float(opts.get("--sleep-idle-seconds", "-1"))
    reranking = "--reranking" in opts
    tools_caps = opts.get("--fake-tools-caps")
    fake_slots = "--fake-slots" in opts
    parallel = int(opts.get("--parallel") or opts.get("-np") or 1)
    prompt_tokens = int(opts.get("--fake-prompt-tokens", "2"))
    #: --fake-prompt-tokens N with --fake-slots: every prompt the same N tokens; else its words.
    same_prompt = "--fake-prompt-tokens" in opts
    n_ctx = int(opts.get("--ctx-size") or 4096)
    kv = _Slots(parallel, n_ctx, _unified(sys.argv[1:]))  # what each slot holds
    last_task = [time.monotonic()]
    ready = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet, like -lv 0
            pass

        def _send(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                if ready.is_set():
                    self._send(200, {"status": "ok"})
                else:
                    self._send(503, {"error": {"code": 503, "message": "Loading model"}})
            elif self.path == "/metrics":
                self._send(200, {})
            elif self.path.partition("?")[0] == "/slots" and fake_slots:
                self._send(200, kv.report())
            elif self.path == "/props":
                asleep = 0 < sleep_idle <= time.monotonic() - last_task[0]
                props: dict[str, object] = {"build_info": "fake", "is_sleeping": asleep}
                if tools_caps is not None:
                    props["chat_template_caps"] = {"supports_tools": tools_caps == "1"}
                self._send(200, props)
            else:
                self._send(404, {"error": {"code": 404, "message": "File Not Found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if key and self.headers.get("Authorization") != f"Bearer {key}":
                self._send(401, {"error": {"code": 401, "message": "Invalid API Key"}})
                return
            if self.path.startswith("/slots/"):
                self._slots(body)
                return
            if self.path in ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking"):
                self._rerank(body)
                return
            if self.path not in ("/v1/chat/completions", "/v1/completions", "/completion", "/v1/messages"):
                self._send(404, {"error": {"code": 404, "message": "File Not Found"}})
                return
            if die_on_request:
                _die(die_on_request)
            last_task[0] = time.monotonic()  # a task wakes a sleeping server (and restarts the idle clock)
            time.sleep(first_token_delay)
            if error_status:
                message = f"fake failure ({error_status} on command)"
                self._send(
                    error_status,
                    {"error": {"code": error_status, "message": message, "type": "server_error"}},
                )
                return
            print(
                "slot print_timing: id  0 | task 0 | prompt eval time =       1.00 ms /     2 tokens",
                file=sys.stderr,
                flush=True,
            )
            if self.path == "/completion":
                n = int(body.get("n_predict") or chunks)
                done: dict[str, object] = {
                    "content": " ".join("tok" for _ in range(n)),
                    "tokens_predicted": n,
                }
                slot = body.get("id_slot")
                if isinstance(slot, int):  # what the slot held (a restore, its last task), reused
                    words = str(body.get("prompt") or "").split()
                    taken = kv.start(slot, words, n)
                    if isinstance(taken[1], str):
                        self._error(taken[0], taken[1])
                        return
                    kv.done(slot, words, str(done["content"]).split())
                    reused = taken[1]
                    done["timings"] = {"cache_n": reused, "prompt_n": len(words) - reused, "predicted_n": n}
                self._send(200, done)
                return
            if self.path == "/v1/messages":
                self._messages(bool(body.get("stream")))
                return
            chat = self.path == "/v1/chat/completions"
            stream = bool(body.get("stream"))
            if "--fake-tool-calls" in opts and chat and _asks_tool(body):
                self._tool_call(body, stream)
                return
            text = (
                " ".join("tok" for _ in range(chunks))
                if not stream
                else "".join(f"tok{i} " for i in range(chunks))
            )
            prompt: list[str] = []
            slot, cached, n_prompt = body.get("id_slot"), 0, prompt_tokens
            if fake_slots and chat:  # the slot it runs in: reused, then holding this task's tokens
                if same_prompt:
                    prompt = [f"p{i}" for i in range(prompt_tokens)]
                else:
                    prompt = _words(body.get("messages"))
                taken = kv.start(slot, prompt, chunks)
                if isinstance(taken[1], str):
                    self._error(taken[0], taken[1])
                    return
                slot, cached, n_prompt = taken[0], taken[1], len(prompt)
            if not stream:
                choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
                usage = {
                    "completion_tokens": chunks,
                    "prompt_tokens": n_prompt,
                    "total_tokens": chunks + n_prompt,
                    "prompt_tokens_details": {"cached_tokens": cached},
                }
                answer: dict[str, object] = {
                    "object": "fake",
                    "choices": [{"index": 0, "finish_reason": "length", **choice}],
                    "usage": usage,
                }
                if fake_slots and chat:
                    answer["timings"] = {
                        "cache_n": cached,
                        "prompt_n": n_prompt - cached,
                        "predicted_n": chunks,
                    }
                    assert isinstance(slot, int)
                    kv.done(slot, prompt, text.split())
                self._send(200, answer)
                return
            events = []
            for i in range(chunks):
                delta = {"delta": {"content": f"tok{i} "}} if chat else {"text": f"tok{i} "}
                piece = {"index": 0, "finish_reason": None, **delta}
                events.append(f"data: {json.dumps({'choices': [piece]})}\n\n")
            # As the real one ends: a last chunk with the finish reason and its ``timings`` (what it
            # read and produced; sent without ``include_usage`` too), then [DONE].
            end: dict[str, object] = {"delta": {}} if chat else {"text": ""}
            last = {"index": 0, "finish_reason": "length", **end}
            timings = {"cache_n": 0, "prompt_n": 2, "predicted_n": chunks}
            if fake_slots and chat:  # what the slot held, as the non-streamed answer
                timings = {"cache_n": cached, "prompt_n": n_prompt - cached, "predicted_n": chunks}
            events.append(f"data: {json.dumps({'choices': [last], 'timings': timings})}\n\n")
            try:
                self._stream(events, "data: [DONE]\n\n")
            finally:
                if fake_slots and chat and isinstance(slot, int):
                    kv.done(slot, prompt, text.split())

        def _error(self, status: int, message: str) -> None:
            """llama-server's error body: 400 for a prompt over the context, else 500."""
            kind = "exceed_context_size_error" if status == 400 else "server_error"
            self._send(status, {"error": {"code": status, "message": message, "type": kind}})

        def _rerank(self, body: dict[str, object]) -> None:
            if not reranking:
                message = "This server does not support reranking. Start it with `--reranking`"
                self._send(501, {"error": {"code": 501, "message": message, "type": "not_supported_error"}})
                return
            docs = body.get("documents", body.get("texts"))
            if not isinstance(docs, list) or not docs:
                message = '"documents" must be a non-empty string array'
                self._send(400, {"error": {"code": 400, "message": message, "type": "invalid_request_error"}})
                return
            scores = [{"index": i, "relevance_score": 1.0 / (i + 1)} for i in range(len(docs))]
            self._send(200, {"model": opts.get("--alias", ""), "object": "list", "results": scores})

        def _messages(self, stream: bool) -> None:
            """``/v1/messages`` as llama-server answers it (Anthropic's shape)."""
            text = " ".join("tok" for _ in range(chunks))
            if not stream:
                content = [{"type": "text", "text": text}]
                usage = {"cache_read_input_tokens": 0, "input_tokens": 2, "output_tokens": chunks}
                self._send(
                    200,
                    {
                        "id": "msg_fake",
                        "type": "message",
                        "role": "assistant",
                        "content": content,
                        "model": "fake",
                        "stop_reason": "max_tokens",
                        "usage": usage,
                    },
                )
                return

            def event(kind: str, data: dict[str, object]) -> str:
                return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

            message = {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "fake",
                "usage": {"input_tokens": 2, "output_tokens": 0},
            }
            events = [
                event("message_start", {"message": message}),
                event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
            ]
            events += [
                event(
                    "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": f"tok{i} "}}
                )
                for i in range(chunks)
            ]
            events += [
                event("content_block_stop", {"index": 0}),
                event(
                    "message_delta",
                    {"delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": chunks}},
                ),
            ]
            self._stream(events, event("message_stop", {}))

        def _tool_call(self, body: dict[str, object], stream: bool) -> None:
            """``--fake-tool-calls``: a FAKE call of the request's first tool, its arguments
            streamed in three pieces, as an OpenAI server answers one."""
            tools = body["tools"]
            assert isinstance(tools, list)
            name = tools[0]["function"]["name"]
            args = json.dumps({"fake": "arg", "n": 1})
            call = {"id": "call_fake", "type": "function", "function": {"name": name, "arguments": args}}
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 3,
                "total_tokens": prompt_tokens + 3,
            }
            if not stream:
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                choice = {"index": 0, "finish_reason": "tool_calls", "message": message}
                self._send(200, {"id": "chatcmpl-fake", "choices": [choice], "usage": usage})
                return
            third = len(args) // 3
            pieces = [args[:third], args[third : 2 * third], args[2 * third :]]
            frags = [
                {
                    "index": 0,
                    "id": "call_fake",
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
            ]
            frags += [{"index": 0, "function": {"arguments": p}} for p in pieces]
            events = [
                f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'tool_calls': [f]}}]})}\n\n"
                for f in frags
            ]
            end = {"choices": [{"index": 0, "finish_reason": "tool_calls", "delta": {}}]}
            events.append(f"data: {json.dumps(end)}\n\n")
            events.append(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n")
            self._stream(events, "data: [DONE]\n\n")

        def _stream(self, events: list[str], last: str) -> None:
            """Send ``events`` one by one (``--fake-token-delay`` apart), then ``last``; die midway
            on command; stop when the client has gone, as the real server cancels its task."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for i, text in enumerate(events):
                    if i == die_mid_stream:
                        print("fake llama-server: dying mid-stream on command", file=sys.stderr, flush=True)
                        _die("SIGKILL")
                    self._chunk(text)
                    time.sleep(token_delay)
                self._chunk(last)
                time.sleep(linger_after_end)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                print(
                    f"fake llama-server: client closed the stream after {i} chunks",
                    file=sys.stderr,
                    flush=True,
                )

        def _slots(self, body: dict[str, object]) -> None:
            """``POST /slots/N?action=save|restore|erase`` as llama-server answers them: a save is
            a file in the ``--slot-save-path`` dir holding the slot's tokens (100 bytes a token;
            without ``--fake-slots`` an empty slot saves ``FAKE_SLOT_TOKENS`` made-up ones, so that
            a planned stop always has something to save), a restore puts them back."""
            save_dir = opts.get("--slot-save-path")
            if not save_dir:
                self._send(
                    501, {"error": {"code": 501, "message": "This server does not support slots action."}}
                )
                return
            slot_text, _, params = self.path[len("/slots/") :].partition("?")
            query = parse_qs(params).get("action", [""])[0]
            slot = int(slot_text) if slot_text.isdigit() else -1
            if slot not in kv.held:
                self._send(400, {"error": {"code": 400, "message": "Invalid slot ID"}})
                return
            path = Path(save_dir) / str(body.get("filename"))
            if query == "save":
                with kv.lock:
                    tokens = list(kv.held[slot])
                if not tokens and not fake_slots:
                    tokens = ["t"] * int(os.environ.get("FAKE_SLOT_TOKENS", "7"))
                data = json.dumps(tokens).encode()
                path.write_bytes(data.ljust(100 * max(len(tokens), 1)))
                time.sleep(float(opts.get("--fake-save-seconds", "0")))  # still "writing" it
                self._send(
                    200,
                    {
                        "id_slot": slot,
                        "n_saved": len(tokens),
                        "n_written": path.stat().st_size,
                        "timings": {"save_ms": 0.1},
                    },
                )
            elif query == "restore" and path.exists():
                data = path.read_bytes()
                try:
                    tokens = [str(t) for t in json.loads(data)]
                except ValueError:
                    self._error(400, "Unable to restore slot: Invalid tokens in slot save file")
                    return
                # --fake-restore-noop: llama.cpp #26676, the restore reports its tokens but the
                # slot is left empty, so the next request computes from 0.
                noop = "--fake-restore-noop" in opts or os.environ.get("FAKE_LLAMA_RESTORE_NOOP")
                refused = kv.restore(slot, tokens, bool(noop))
                if refused is not None:
                    self._error(400, refused)
                    return
                answer = {
                    "id_slot": slot,
                    "n_restored": len(tokens),
                    "n_read": len(data),
                    "timings": {"restore_ms": 0.1},
                }
                self._send(200, answer)
            elif query == "erase":
                self._send(200, {"id_slot": slot, "n_erased": kv.erase(slot)})
            else:
                self._send(400, {"error": {"code": 400, "message": "Unable to restore slot: no such file"}})

        def _chunk(self, text: str) -> None:
            data = text.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if load_s:
        print("llama_model_load: loading (fake)", file=sys.stderr, flush=True)
        time.sleep(load_s)
    ready.set()
    print(
        f"main: server is listening on http://{host}:{port} - starting the main loop",
        file=sys.stderr,
        flush=True,
    )
    crash_after = opts.get("--fake-crash-after")
    if crash_after is not None:
        time.sleep(float(crash_after))
        print("fake llama-server: crashing on command", file=sys.stderr, flush=True)
        os._exit(1)
    threading.Event().wait()  # until a signal ends us (SIGTERM's default action)


if __name__ == "__main__":
    main()
