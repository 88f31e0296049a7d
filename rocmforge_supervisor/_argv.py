"""llama-server's command line, as forge knows it: the one place its flag vocabulary lives.

Everyone who reads or writes a llama-server argument comes here: the config refuses the flags forge
owns (``is_owned_flag``), placement reads the flags that change a child's size (``SIZE_FLAGS``),
the launch adds a chat template for GGUFs without one (``fallback_chat_template_args``), the
process layer builds the argv (``server_argv``) and logs it without secrets (``redact``).

It sits at the bottom of the package, beside ``_errors``, because the config (the lowest layer)
validates against it; ``process/`` is the only package that runs what it builds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "EMBEDDING_ARCHITECTURES",
    "OWNED_BY_KEY",
    "SIZE_FLAGS",
    "TEMPLATE_FLAGS",
    "embedding_args",
    "fallback_chat_template_args",
    "is_owned_flag",
    "kv_unified_in_args",
    "mmproj_args",
    "normalise_flag",
    "outputs_every_token",
    "probe_argv",
    "redact",
    "rerank_args",
    "resolve_kv_unified",
    "rpc_args",
    "server_argv",
    "speculative_args",
]

#: llama-server flags forge sets itself (or that would turn the child into something else: another
#: model source, a router, TLS, a log format the supervisor cannot read). Long forms are compared
#: after llama.cpp's own ``--foo_bar`` → ``--foo-bar`` normalisation.
OWNED_FLAGS = frozenset(
    {
        "-m", "--model", "-mu", "--model-url",
        "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-dr", "--docker-repo",
        "--host", "--port", "--reuse-port",
        "-a", "--alias",
        "--api-key", "--api-key-file",
        "--metrics", "--no-webui", "--webui", "--ui", "--no-ui",
        "--models-dir", "--models-preset", "--models-max", "--models-autoload", "--no-models-autoload",
        "--ssl-key-file", "--ssl-cert-file",
        "-lv", "--verbosity",
        "--slot-save-path",
        "-mm", "--mmproj", "-mmu", "--mmproj-url", "--mmproj-auto", "--no-mmproj", "--no-mmproj-auto",
        "--mmproj-offload", "--no-mmproj-offload", "--media-path",
        "--slots", "--no-slots",  # the progress watchdog and the KV-usage gauge read /slots
    }
)  # fmt: skip
#: The forge.toml key to use instead of an owned flag, where there is one (the config's error).
OWNED_BY_KEY: Mapping[str, str] = {
    **dict.fromkeys(("-mm", "--mmproj", "-mmu", "--mmproj-url", "--mmproj-auto", "--no-mmproj",
                     "--no-mmproj-auto"), "mmproj"),
    **dict.fromkeys(("--mmproj-offload", "--no-mmproj-offload"), "mmproj_offload"),
}  # fmt: skip
OWNED_PREFIXES = ("--log-",)

#: Flags that change how much memory a child takes → the placement request field they set.
SIZE_FLAGS: Mapping[str, str] = {
    "-c": "ctx_size",
    "--ctx-size": "ctx_size",
    "-np": "parallel",
    "--parallel": "parallel",
    "-ctk": "cache_type_k",
    "--cache-type-k": "cache_type_k",
    "-ctv": "cache_type_v",
    "--cache-type-v": "cache_type_v",
    "-fa": "flash_attn",
    "--flash-attn": "flash_attn",
    "-ub": "n_ubatch",
    "--ubatch-size": "n_ubatch",
    "-ngl": "n_gpu_layers",
    "--gpu-layers": "n_gpu_layers",
    "--n-gpu-layers": "n_gpu_layers",
    "-ts": "tensor_split",
    "--tensor-split": "tensor_split",
}

#: A user's own chat-template flags: when any is given, forge adds none.
TEMPLATE_FLAGS = (
    "--chat-template",
    "--chat-template-file",
    "--chat-template-kwargs",
    "--jinja",
    "--no-jinja",
)

#: Architectures whose chat format is unambiguous → llama.cpp built-in template name.
_TEMPLATE_BY_ARCH = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
    "phi3": "phi3",
    "command-r": "command-r",
    "cohere2": "command-r",
    "deepseek2": "deepseek2",
    "exaone": "exaone3",
}

#: Architectures llama.cpp treats as encoders (embedding models, no text generation): their GGUF
#: names its own pooling, so forge adds no ``--pooling``; Ollama's listings give them no
#: ``completion`` capability. The one list (it had drifted into two).
EMBEDDING_ARCHITECTURES = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert", "neo-bert",
     "t5encoder", "gemma-embedding"}
)  # fmt: skip

_SECRET_WORDS = ("token", "key", "password", "secret")


def normalise_flag(arg: str) -> str | None:
    """The flag an argument names, as llama.cpp matches it (``--foo_bar=1`` → ``--foo-bar``)."""
    if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit():
        return None  # a value (negative numbers included), not a flag
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name


def is_owned_flag(arg: str) -> bool:
    flag = normalise_flag(arg)
    return flag is not None and (flag in OWNED_FLAGS or flag.startswith(OWNED_PREFIXES))


def fallback_chat_template_args(
    has_chat_template: bool, architecture: str, extra_args: Sequence[str]
) -> list[str]:
    """A built-in chat template for a GGUF that carries none.

    llama-server falls back to ChatML when a GGUF has no ``tokenizer.chat_template``; for a model
    trained on another format that gives garbage (seen with the embedded gemma-3-270m GGUF, whose
    replies echoed ``<|im_end|>``). Where the architecture names its format unambiguously, pass
    llama.cpp's built-in template of that name. The built-in names only work without jinja: with
    jinja on (the server's default) ``--chat-template gemma`` is taken as a literal Jinja template
    and every prompt renders as the word "gemma" (seen through ``/apply-template``). Hence
    ``--no-jinja``; a GGUF without a template has no tool template either, so nothing is lost.
    A user's own template flags always win.
    """
    if has_chat_template:
        return []
    if any(a.split("=", 1)[0] in TEMPLATE_FLAGS for a in extra_args):
        return []
    name = _TEMPLATE_BY_ARCH.get(architecture)
    return ["--no-jinja", "--chat-template", name] if name else []


def embedding_args(embeddings: bool, user_args: Sequence[str], architecture: str = "") -> list[str]:
    """``embeddings = true``: what llama-server needs for OpenAI-shaped ``/v1/embeddings`` at the
    pinned commit: ``--embeddings``, and a pooled vector. A chat model's default pooling is
    ``none`` (answered 400 "Pooling type 'none' is not OAI compatible"), so ``--pooling mean``;
    an embedding model's GGUF carries its own (cls, mean, last), which is kept."""
    if not embeddings:
        return []
    flags = {a.split("=", 1)[0] for a in user_args}
    out = [] if flags & {"--embeddings", "--embedding"} else ["--embeddings"]
    if "--pooling" not in flags and architecture not in EMBEDDING_ARCHITECTURES:
        out += ["--pooling", "mean"]
    return out


def outputs_every_token(args: Sequence[str]) -> bool:
    """Whether a child started with ``args`` computes an output row for every token of a ubatch.

    llama-server (4df29be, ``server_output_limits``) sets ``n_outputs_max = n_batch`` with
    ``--embeddings`` (``--reranking`` implies it) or a ``--pooling`` other than ``none``, instead of
    one per slot; its compute buffer then holds the logits of a whole ubatch (the estimate's
    ``embeddings``)."""
    found = False
    for i, arg in enumerate(args):
        flag, eq, inline = arg.partition("=")
        flag = normalise_flag(flag) or ""
        if flag in ("--embedding", "--embeddings", "--reranking", "--rerank"):
            found = True
        elif flag == "--pooling":
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            found = found or value.lower() not in ("none", "")
    return found


#: ``--kv-unified`` and ``--no-kv-unified`` in every spelling llama.cpp takes → the value they set.
_KV_UNIFIED_FLAGS = {"-kvu": True, "--kv-unified": True, "-no-kvu": False, "--no-kv-unified": False}


def kv_unified_in_args(args: Sequence[str]) -> bool | None:
    """Whether ``args`` turn the unified KV cache on (True) or off (False), the last flag winning as
    in llama.cpp; None when they say nothing (the model's ``kv_unified`` key then decides)."""
    found: bool | None = None
    for arg in args:
        flag = normalise_flag(arg)
        if flag in _KV_UNIFIED_FLAGS:
            found = _KV_UNIFIED_FLAGS[flag]
    return found


def resolve_kv_unified(kv_unified: bool | None, args: Sequence[str]) -> bool:
    """Whether a child shares one KV cache across its slots: its ``args``' own ``-kvu``/``-no-kvu``,
    else the model's ``kv_unified``, else yes. forge's default is llama-server's with automatic
    slots: one request may use the whole context (an even split gave a 4-slot model a quarter)."""
    from_args = kv_unified_in_args(args)
    if from_args is not None:
        return from_args
    return kv_unified is not False


def mmproj_args(projector: Path | None, offload: bool) -> list[str]:
    """``--mmproj FILE`` for a model with a projector, and ``--no-mmproj-offload`` when it is to
    stay in system RAM (llama-server offloads it to the first GPU by default). No ``--media-path``
    ever: ``file://`` media would let a request read the server's files."""
    if projector is None:
        return []
    return ["--mmproj", str(projector)] + ([] if offload else ["--no-mmproj-offload"])


def rpc_args(addresses: Sequence[str], tensor_split: Sequence[float] = ()) -> list[str]:
    """``--rpc HOST:PORT,…`` (the RPC workers, in llama-server's device order) and, when given,
    ``--tensor-split`` (each device's share of the layers)."""
    a = ["--rpc", ",".join(addresses)] if addresses else []
    if tensor_split:
        a += ["--tensor-split", ",".join(f"{x:g}" for x in tensor_split)]
    return a


def probe_argv(binary: Path, *, version: bool = False, rpc: str | None = None) -> list[str]:
    """A short run of the binary that answers and exits: ``--version``, else ``--list-devices``
    (through the RPC worker ``rpc``: the worker's own devices)."""
    if version:
        return [str(binary), "--version"]
    return [str(binary), *rpc_args([rpc] if rpc else []), "--list-devices"]


def server_argv(
    *,
    binary: Path,
    model_path: Path,
    host: str,
    port: int,
    alias: str,
    api_key_file: Path | None,
    ctx_size: int | None,
    cpu_only: bool,
    n_gpu_layers: int | str | None,
    parallel: int | None,
    verbosity: int | None,
    extra_args: Sequence[str],
) -> list[str]:
    """The whole command line of one child; ``extra_args`` come last, so they win."""
    a = [
        str(binary),
        "--model", str(model_path),
        "--host", host,
        "--port", str(port),
        "--alias", alias,
        "--metrics",
        "--no-webui",
        "--log-colors", "off",
    ]  # fmt: skip
    if api_key_file is not None:  # None: no key at all (a loopback-only child)
        a += ["--api-key-file", str(api_key_file)]
    if ctx_size is not None:
        a += ["--ctx-size", str(ctx_size)]
    if cpu_only:
        a += ["--device", "none"]  # no offload at all (an -ngl would only add warnings)
    elif n_gpu_layers is not None:
        a += ["--n-gpu-layers", str(n_gpu_layers)]
    if parallel is not None:
        a += ["--parallel", str(parallel)]
    if verbosity is not None:
        a += ["--log-verbosity", str(verbosity)]
    a += list(extra_args)
    return a


def redact(args: Sequence[str]) -> list[str]:
    """Values of secret-looking flags (``--hf-token X``) never reach the log."""
    out: list[str] = []
    hide_next = False
    for a in args:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        name, eq, _ = a.partition("=")
        secret = (
            name.startswith("-")
            and any(w in name.lower() for w in _SECRET_WORDS)
            and not name.endswith("-file")
        )
        if secret and eq:
            out.append(f"{name}=***")
        else:
            out.append(a)
            hide_next = secret
    return out


def speculative_args(
    draft: Path | None,
    types: Sequence[str],
    *,
    n_max: int | None = None,
    n_min: int | None = None,
    draft_on_gpu: bool = True,
    name_type: bool = True,
) -> list[str]:
    """The speculative-decoding flags of the pinned llama-server. A draft model goes with its
    layers all on the model's GPUs (split as the model is: the estimate counts it so) or, off the
    GPU, with no device at all. ``types`` empty with a draft: ``draft-simple``, without which the
    pin loads the draft and never drafts — unless ``name_type`` is False (the draft GGUF declares
    its own type, an MTP head or a DFlash draft, which llama-server reads from it)."""
    a: list[str] = []
    if draft is not None:
        a += ["--spec-draft-model", str(draft)]
        a += (
            ["--spec-draft-ngl", "all"]
            if draft_on_gpu
            else ["--spec-draft-device", "none", "--spec-draft-ngl", "0"]
        )
    chosen = list(types) or (["draft-simple"] if draft is not None and name_type else [])
    if chosen:
        a += ["--spec-type", ",".join(chosen)]
    if n_max is not None:
        a += ["--spec-draft-n-max", str(n_max)]
    if n_min is not None:
        a += ["--spec-draft-n-min", str(n_min)]
    return a


def rerank_args(rerank: bool) -> list[str]:
    """``rerank = true``: ``--reranking`` (embeddings with the GGUF's rank pooling, and the
    ``/v1/rerank`` and ``/rerank`` routes)."""
    return ["--reranking"] if rerank else []


#: The flags ``[models.X.adapters.*]`` own (every spelling at the pin): a second ``--lora`` in
#: ``args`` would shift the adapters' ids, which requests name.
LORA_FLAGS = frozenset({"--lora", "--lora-scaled", "--lora-init-without-apply"})


def lora_args(adapters: Sequence[Path]) -> list[str]:
    """The model's LoRA adapters, all loaded at scale 0: a request picks them by id and scale
    (``"lora": [{"id": 0, "scale": 1.0}]``), in this order. ``--lora FILE`` would not do: the
    pinned llama-server gives a request without a ``lora`` field every adapter at its start scale
    (``launch_slot_with_task``: ``slot.lora = params_base.lora_adapters``), 1.0 for ``--lora``,
    whatever ``--lora-init-without-apply`` says; so the base model's own requests would run with
    all of them. One comma-separated flag: repeated ones keep only the last. A path with ``,`` or
    ``:`` cannot be written in it (refused at config check)."""
    if not adapters:
        return []
    return ["--lora-scaled", ",".join(f"{p}:0" for p in adapters), "--lora-init-without-apply"]
