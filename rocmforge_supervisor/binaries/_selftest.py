"""A llama-server is proven to run on this machine before a model is handed to it.

``--version`` says a file is llama-server; it does not say the file can compute here. At the pinned
llama.cpp, ggml's AMX kernels crash on the first matrix multiply of a generated token (PR #26954)
on most cloud x86 servers, and a native build copied to an older CPU dies of SIGILL. Either way
every model would crash on its first request, so after every build, and once per located binary
(path, mtime, size, CPU), forge starts it on a tiny GGUF of its own (:mod:`._tinymodel`) with a
child's flags and asks for one completion.

Where the default flags die of a CPU fault, the self-test tries the known workaround, ``--no-repack``
(the AMX path is one of the CPU backend's "extra buffer types"; without them ggml uses its plain
kernels), and records that every child needs it. No CPU-model list decides: when a pin with the
upstream fix passes with the default flags, the workaround goes away by itself.
"""

from __future__ import annotations

import collections
import hashlib
import json
import re
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from filelock import FileLock

from .._errors import SelfTestFailed
from .._files import write_text_atomic
from ..config import ForgeSettings
from ..hardware import cpu_flags, cpu_model_name
from ..models import REQUIRED_VERBOSITY
from ..process import InstanceSpec, crash_advice, describe_returncode, probe_server
from ._gpurun import backend_init_failures
from ._plan import isa_fingerprint, isa_flags
from ._tinymodel import N_SPECIAL_TOKENS, write_selftest_gguf

__all__ = [
    "WORKAROUNDS",
    "Attempt",
    "SelfTest",
    "binary_stamp",
    "proven",
    "run_selftest",
]

#: The flags tried, in order, when the default ones die of a CPU fault. ``--no-repack``: no extra
#: buffer types (AMX, CPU_REPACK), so ggml's plain CPU kernels run (PR #26954's crash is in AMX).
WORKAROUNDS: tuple[tuple[str, ...], ...] = (("--no-repack",),)

_CPU_FAULTS = frozenset({-signal.SIGILL, -signal.SIGSEGV, -signal.SIGBUS, -signal.SIGFPE})
_BUFFER_RE = re.compile(r"\b(\S+) model buffer size\s*=")
_LOADED_RE = re.compile(r"loaded (\S+) backend from (\S+)")
#: ``system_info: … | CPU : SSE3 = 1 | AVX = 1 | … |``: the instruction sets of the CPU backend that
#: runs (in a portable build, the variant the dispatch chose; its module load is not logged).
_SYSTEM_INFO_RE = re.compile(r"system_info: .*?\| CPU : (.*)$")

#: llama.cpp's x86 CPU variants at the pin (ggml/src/CMakeLists.txt, ggml_add_cpu_backend_variant),
#: by the features ``system_info`` prints (SSE4.2 is not printed; every variant past x64 has it).
CPU_VARIANTS: dict[str, frozenset[str]] = {
    "x64": frozenset(),
    "sandybridge": frozenset({"AVX"}),
    "ivybridge": frozenset({"AVX", "F16C"}),
    "piledriver": frozenset({"AVX", "F16C", "FMA"}),
    "haswell": frozenset({"AVX", "F16C", "FMA", "AVX2", "BMI2"}),
    "skylakex": frozenset({"AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512"}),
    "cannonlake": frozenset({"AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI"}),
    "cascadelake": frozenset({"AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VNNI"}),
    "icelake": frozenset({"AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI"}),
    "cooperlake": frozenset({"AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VNNI", "AVX512_BF16"}),
    "zen4": frozenset(
        {"AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"}
    ),
    "alderlake": frozenset({"AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX_VNNI"}),
    "sapphirerapids": frozenset(
        {
            "AVX",
            "F16C",
            "FMA",
            "AVX2",
            "BMI2",
            "AVX512",
            "AVX512_VBMI",
            "AVX512_VNNI",
            "AVX512_BF16",
            "AMX_INT8",
        }
    ),
}


def cpu_variant(features: Sequence[str]) -> str | None:
    """The portable build's variant that the features ``system_info`` printed belong to: the one
    with the most of them (None when nothing was printed)."""
    if not features:
        return None
    have = set(features)
    fitting = [(len(need), name) for name, need in CPU_VARIANTS.items() if need <= have]
    return max(fitting)[1] if fitting else None


_PROMPT = "hello world"
_N_PREDICT = 8


@dataclass(frozen=True)
class Attempt:
    """One start of the binary with ``args`` added: did it serve, and if not, how it ended."""

    args: tuple[str, ...]
    ok: bool
    outcome: str
    returncode: int | None = None
    crashed_in: str | None = None  # "load" or "completion": where a crash happened
    log_tail: tuple[str, ...] = ()
    buffers: tuple[str, ...] = ()  # the model buffer types the child used: CPU_REPACK, AMX, CUDA0…
    backends_loaded: tuple[str, ...] = ()  # a portable build's modules: libggml-cpu-haswell.so…
    cpu_features: tuple[str, ...] = ()  # what the running CPU backend was built with (system_info)
    gpu_init: tuple[str, ...] = ()  # why a GPU backend found no device: "ROCm: no ROCm-capable …"


@dataclass(frozen=True)
class SelfTest:
    """The result kept in ``build-info.json`` (and, for a located binary, in the self-test cache)."""

    ok: bool
    child_args: tuple[str, ...]  # what every child of this binary gets on this CPU
    detail: str  # one line for `forge build`, `forge doctor` and errors
    seconds: float
    cpu: str  # the ISA fingerprint of the CPU it ran on
    cpu_model: str
    cpu_isa: tuple[str, ...]
    attempts: tuple[Attempt, ...] = field(default=())
    #: The slot save/restore check on the passing start: "ok", what went wrong ("no-op: …",
    #: llama.cpp #26676, where the conversation tier turns itself off), or "" when not run.
    slot_restore: str = ""

    @property
    def passing(self) -> Attempt | None:
        return next((a for a in self.attempts if a.ok), None)

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        out["buffers"] = list(self.passing.buffers) if self.passing else []
        out["backends_loaded"] = list(self.passing.backends_loaded) if self.passing else []
        out["cpu_features"] = list(self.passing.cpu_features) if self.passing else []
        out["cpu_variant"] = cpu_variant(self.passing.cpu_features) if self.passing else None
        out["gpu_init"] = list(self.passing.gpu_init) if self.passing else []
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> SelfTest | None:
        """A stored result, or None when it is unreadable (then the test simply runs again)."""
        try:
            raw_attempts = data["attempts"]
            if not isinstance(raw_attempts, list):
                return None
            attempts = tuple(_attempt_from_json(a) for a in raw_attempts)
            return cls(
                ok=bool(data["ok"]),
                child_args=_strs(data["child_args"]),
                detail=str(data["detail"]),
                seconds=float(str(data["seconds"])),
                cpu=str(data["cpu"]),
                cpu_model=str(data["cpu_model"]),
                cpu_isa=_strs(data["cpu_isa"]),
                attempts=attempts,
                slot_restore=str(data.get("slot_restore") or ""),
            )
        except (KeyError, TypeError, ValueError):
            return None


def _strs(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise TypeError("not a list")
    return tuple(str(v) for v in value)


def _attempt_from_json(a: object) -> Attempt:
    if not isinstance(a, dict):
        raise TypeError("not an object")
    rc = a.get("returncode")
    return Attempt(
        args=_strs(a["args"]),
        ok=bool(a["ok"]),
        outcome=str(a["outcome"]),
        returncode=int(rc) if isinstance(rc, int) else None,
        crashed_in=str(a["crashed_in"]) if a.get("crashed_in") else None,
        log_tail=_strs(a.get("log_tail", [])),
        buffers=_strs(a.get("buffers", [])),
        backends_loaded=_strs(a.get("backends_loaded", [])),
        cpu_features=_strs(a.get("cpu_features", [])),
        gpu_init=_strs(a.get("gpu_init", [])),
    )


def _isa() -> tuple[str, tuple[str, ...]]:
    flags = cpu_flags()
    return isa_fingerprint(flags), isa_flags(flags)


def run_selftest(
    binary: Path,
    workdir: Path,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> SelfTest:
    """Start ``binary`` on the self-test model and ask for one completion; on a CPU fault, try the
    :data:`WORKAROUNDS`. Never raises for the binary's behaviour: the result says what happened."""
    started = time.monotonic()
    model = write_selftest_gguf(workdir)
    fingerprint, isa = _isa()
    attempts: list[Attempt] = []
    restore = ""  # the restore check of the passing start
    for args in ((), *WORKAROUNDS):
        attempt, checked = _attempt(binary, model, args, env, timeout, workdir)
        attempts.append(attempt)
        if attempt.ok:
            restore = checked
        if attempt.ok or attempts[0].returncode not in _CPU_FAULTS:
            break
    passing = next((a for a in attempts if a.ok), None)
    first = attempts[0]
    if passing is not None and passing is first:
        detail = f"served {_N_PREDICT} tokens" + (f" ({', '.join(first.buffers)})" if first.buffers else "")
    elif passing is not None:
        detail = (
            f"the default flags {first.outcome}; with {' '.join(passing.args)} it served "
            f"{_N_PREDICT} tokens: every child gets {' '.join(passing.args)}"
        )
    else:
        # On an AMX CPU the fault is ggml's AMX defect only if the workaround was not tried: a
        # child that dies the same way with --no-repack lacks an instruction like anywhere else.
        tried = any(a.args for a in attempts[1:])
        advice = crash_advice(first.returncode, computed=False, amx="amx_int8" in isa and not tried)
        detail = first.outcome + (f": {advice}" if advice else "")
        if len(attempts) > 1:
            detail += f" (also with {', '.join(' '.join(a.args) for a in attempts[1:])})"
    return SelfTest(
        ok=passing is not None,
        child_args=passing.args if passing is not None else (),
        detail=detail,
        seconds=round(time.monotonic() - started, 2),
        cpu=fingerprint,
        cpu_model=cpu_model_name(),
        cpu_isa=isa,
        attempts=tuple(attempts),
        slot_restore=restore,
    )


class _Seen:
    """The facts the result wants, picked out of the child's log lines as they pass (a listener
    on its log: the lifecycle drains the pipe)."""

    def __init__(self) -> None:
        self.tail: collections.deque[str] = collections.deque(maxlen=25)
        self.buffers: list[str] = []
        self.loaded: list[str] = []
        self.features: list[str] = []
        self.gpu_init: list[str] = []

    def feed(self, line: str) -> None:
        self.tail.append(line)
        if (m := _BUFFER_RE.search(line)) and m[1] not in self.buffers:
            self.buffers.append(m[1])
        if m := _LOADED_RE.search(line):
            self.loaded.append(Path(m[2]).name)
        if (m := _SYSTEM_INFO_RE.search(line)) and not self.features:
            pairs = (p.split("=") for p in m[1].split("|") if "=" in p)
            self.features = [k.strip() for k, v in pairs if v.strip() == "1"]
        for failure in backend_init_failures((line,)):
            if failure not in self.gpu_init:
                self.gpu_init.append(failure)


def _attempt(
    binary: Path,
    model: Path,
    args: tuple[str, ...],
    env: Mapping[str, str] | None,
    timeout: float,
    workdir: Path,
) -> tuple[Attempt, str]:
    """One start through process/'s lifecycle (a port of its own, retried if the bind races),
    one completion, the slot restore check, the stop. The check's result comes second."""
    seen = _Seen()
    restore: list[str] = []
    slots = workdir / "selftest-slots"
    slots.mkdir(exist_ok=True)

    def ask(client: httpx.Client) -> str:
        outcome = _complete(client, timeout)
        if outcome == "ok":
            restore.append(_restore_check(client, timeout))
        return outcome

    # The flags a child gets (server_argv: --metrics, --no-webui, …; the default threads and
    # repack), on a small context and one slot: the test is of the binary, not of the model.
    spec = InstanceSpec(
        binary=binary,
        model_path=model,
        alias="forge-selftest",
        ctx_size=256,
        parallel=1,
        verbosity=REQUIRED_VERBOSITY,  # as a child: its buffer lines say which kernels ran
        extra_args=(*args, "--slot-save-path", str(slots)),
        parent_env=env,
        line_listeners=[seen.feed],
    )
    run = probe_server(spec, ask, timeout=timeout)
    shutil.rmtree(slots, ignore_errors=True)
    checked = restore[0] if restore else ""
    if run.outcome == "ok":
        return _attempt_result(seen, args, True, f"served {_N_PREDICT} tokens", None, "completion"), checked
    stage = "load" if run.stage == "load" else "completion"
    rc = run.returncode
    if run.crashed:
        where = "on its first completion" if stage == "completion" else "while loading"
        return _attempt_result(seen, args, False, f"{describe_returncode(rc)} {where}", rc, stage), checked
    if run.failure is not None:
        what = (
            "was not ready in time"
            if run.failure.reason == "timeout"
            else f"did not start: {run.failure.message}"
        )
    else:
        what = "gave no completion in time" if run.outcome == "timeout" else f"answered {run.outcome}"
    return _attempt_result(seen, args, False, what, rc, stage), checked


def _complete(client: httpx.Client, timeout: float) -> str:
    """ "ok", "timeout", or what it answered instead of a completion."""
    # Random weights: the byte and control tokens are banned so the text is valid UTF-8 (the
    # server's output parser refuses a lone continuation byte with a 500).
    body = {
        "prompt": _PROMPT,
        "n_predict": _N_PREDICT,
        "ignore_eos": True,
        "temperature": 0,
        "logit_bias": [[token, False] for token in range(N_SPECIAL_TOKENS)],
    }
    try:
        r = client.post("/completion", json=body, timeout=timeout)
    except httpx.TimeoutException:
        return "timeout"
    except httpx.HTTPError:
        return "no answer (connection lost)"  # most likely the child died: the probe says how
    if r.status_code != 200:
        return f"HTTP {r.status_code}"
    try:
        predicted = int(r.json().get("tokens_predicted", 0))
    except (ValueError, AttributeError, TypeError):
        return "a body that is not llama-server's completion"
    return "ok" if predicted > 0 else "no tokens"


def _restore_check(client: httpx.Client, timeout: float) -> str:
    """Does a restored slot serve the next request (llama.cpp #26676: at some builds a restore
    reports its tokens, then the next request computes the prompt from 0)? A prompt into slot 0,
    the slot saved, erased, restored, the prompt again: the child must reuse it. "ok", or what
    went wrong. A build without the slot actions says so; it is not a failed self-test."""
    body: dict[str, object] = {
        "prompt": _PROMPT * 8,
        "n_predict": 1,
        "temperature": 0,
        "id_slot": 0,
        "cache_prompt": True,
        "logit_bias": [[token, False] for token in range(N_SPECIAL_TOKENS)],
    }
    name = {"filename": "selftest.slot"}
    try:
        for step, path, payload in (
            ("prompt", "/completion", body),
            ("save", "/slots/0?action=save", name),
            ("erase", "/slots/0?action=erase", {}),
            ("restore", "/slots/0?action=restore", name),
            ("prompt again", "/completion", body),
        ):
            r = client.post(path, json=payload, timeout=timeout)
            if r.status_code != 200:
                return f"not checked: the {step} answered HTTP {r.status_code}"
        answer = r.json()
        timings = answer.get("timings") or {}
        reused = int(timings.get("cache_n", answer.get("tokens_cached", 0)) or 0)
    except (httpx.HTTPError, ValueError, TypeError, AttributeError) as exc:
        return f"not checked: {exc}"
    if reused <= 0:
        return "no-op: a restored slot was not reused, the next request computed its prompt from 0 (llama.cpp #26676)"
    return "ok"


def _attempt_result(
    lines: _Seen, args: tuple[str, ...], ok: bool, outcome: str, rc: int | None, stage: str
) -> Attempt:
    return Attempt(
        args=args,
        ok=ok,
        outcome=outcome,
        returncode=None if ok else rc,
        crashed_in=None if ok or rc is None or rc >= 0 else stage,
        log_tail=tuple(list(lines.tail)[-12:]),
        buffers=tuple(lines.buffers),
        backends_loaded=tuple(lines.loaded),
        cpu_features=tuple(lines.features),
        gpu_init=tuple(lines.gpu_init),
    )


def selftest_record_path(cache_dir: Path, binary: Path) -> Path:
    digest = hashlib.sha256(str(binary.resolve()).encode()).hexdigest()[:16]
    return cache_dir / "selftest" / f"{digest}.json"


def binary_stamp(binary: Path) -> dict[str, object]:
    """What identifies the file tested (a rebuilt or replaced binary is tested again)."""
    st = binary.resolve().stat()
    return {"path": str(binary.resolve()), "mtime_ns": st.st_mtime_ns, "size": st.st_size}


def proven(
    binary: Path,
    settings: ForgeSettings,
    *,
    build_info: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
) -> SelfTest | None:
    """The binary's self-test on this CPU: from its ``build-info.json`` (a build forge made, tested
    on a CPU like this one), else from the record of an earlier run (same path, mtime, size and
    CPU), else run now and recorded when it passes. None: self-tests are turned off.

    Raises :class:`SelfTestFailed` when it cannot serve one completion with any flags tried.
    """
    if not settings.selftest:
        return None
    fingerprint, _ = _isa()
    if build_info is not None and isinstance(build_info.get("selftest"), dict):
        stored = SelfTest.from_json(build_info["selftest"])  # type: ignore[arg-type]
        if stored is not None and stored.ok and stored.cpu == fingerprint:
            return stored
    record = selftest_record_path(settings.cache_dir, binary)
    stamp = binary_stamp(binary)
    found = _read_record(record, stamp, fingerprint)
    if found is not None:
        return found
    record.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(record.with_suffix(".lock"))):  # two commands starting at once test once
        found = _read_record(record, stamp, fingerprint)
        if found is None:
            found = run_selftest(binary, record.parent, env=env)
            if found.ok:
                _write_atomic(record, {"stamp": stamp, "result": found.to_json()})
    if not found.ok:
        raise SelfTestFailed(
            f"{binary} failed its self-test on this machine: {found.detail}",
            hint=_hint(found),
        )
    return found


def _hint(result: SelfTest) -> str:
    first = result.attempts[0] if result.attempts else None
    if first is not None and first.returncode == -signal.SIGILL:
        return "`forge build --force` builds for this CPU; `forge build --portable` for any x86-64"
    return "see `forge doctor`; `forge build --force` rebuilds and tests it again"


def _read_record(record: Path, stamp: Mapping[str, object], fingerprint: str) -> SelfTest | None:
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("stamp") != stamp or not isinstance(data.get("result"), dict):
        return None
    found = SelfTest.from_json(data["result"])
    return found if found is not None and found.ok and found.cpu == fingerprint else None


def _write_atomic(path: Path, data: Mapping[str, object]) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")
