"""How much memory a load will take on each device, before any process is started.

It follows what llama.cpp at the pinned commit does, step by step, so that placement can be
decided without a dry run:

- **weights**: llama.cpp keeps the input layer (token embedding) on the CPU, puts the last
  ``n_gpu_layers`` of the ``n_layer + 1`` layers (the repeating blocks, then the output layer)
  on the GPUs, and splits those across GPUs at the points of ``tensor_split``
  (``llama-model.cpp``, ``get_layer_buft_list``). A tied output head (no ``output.weight``) is a
  second copy of the embedding on the output layer's device, except on the CPU where it is the
  same mapped memory.
- **KV cache**: per layer, cells × (KV heads × key length × bytes of ``cache_type_k`` + the same
  for V). Full-attention layers hold the whole context; sliding-window layers (Gemma 2/3,
  Cohere 2, Llama 4) hold ``pad256(min(ctx, window × streams + n_ubatch))`` cells
  (``llama-kv-cache-iswa.cpp``). The context is rounded up to 256, and with ``--parallel P``
  slots each slot's share is also rounded up to 256.
- **compute**: an allowance, not a derivation: the largest per-layer intermediate of one ubatch
  (the attention scores without flash attention, the feed-forward activations otherwise), plus
  the logits; calibrated against what the real llama-server reserved for the embedded model
  (see tests/models/test_estimate_real.py). Corrected after load by the child's own numbers.
- **embeddings** (``--embeddings``, ``--reranking``, a ``--pooling``): llama-server then asks for
  an output row for every token of a ubatch instead of one per slot (``server_output_limits``:
  ``n_outputs_max = n_batch``, and ``n_batch`` is cut to ``n_ubatch``), and the worst-case graph
  it reserves (``sched_reserve``, ``n_outputs = n_ubatch``) computes the logits of all of them:
  ``n_ubatch × n_vocab × f32`` on the output layer's device (96 MiB for SmolLM2's 49152-token
  vocabulary, 512 MiB for Gemma 3's 262144) next to the masks and a few hidden-state rows. That
  stage, not the layers, is then the compute buffer's peak. The output buffer gains one
  embedding row per slot. Not counted: the output buffer grows to a ubatch of logits and
  embeddings rows in host memory on the first long embedding request (``output_reserve``; a
  debug-only log line, so no allocation line to check it against).
- **projector** (``--mmproj``): a vision/audio model's projector weights and its compute buffer
  (:class:`~._projector.ProjectorInfo`), on the first GPU (mtmd's default) or on the CPU with
  ``--no-mmproj-offload`` or when no GPU is used.
- **device context**: what the GPU backend itself holds on each GPU a process uses — the runtime's
  context, the loaded kernels, library workspaces. It is in no allocation line the child logs, so
  it is a measured figure per backend (:data:`DEVICE_CONTEXT_BYTES`), replaced by what forge
  measures of its own children on that GPU model once it has (``supervisor/placement/_device_context.py``).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from .._errors import UsageError
from ._gguf import GGUFInfo
from ._projector import ProjectorInfo

__all__ = [
    "CACHE_TYPES",
    "DEFAULT_N_UBATCH",
    "DEVICE_CONTEXT_BYTES",
    "DeviceEstimate",
    "MemoryEstimate",
    "backend_of",
    "default_device_context",
    "estimate_memory",
    "kv_bytes_per_token",
]

#: ``--cache-type-k/-v`` values llama-server accepts.
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
DEFAULT_N_UBATCH = 512
_PAD = 256
_F32 = 4
_MIB = 1024**2

#: Device memory one llama-server process holds on each GPU it uses outside its logged allocations
#: (the backend's context, kernels, library handles), per backend, until forge measured its own:
#:
#: * ``cuda``: 645 MiB, measured on an NVIDIA H100 80GB at the pinned llama.cpp: nvidia-smi showed
#:   1414 MiB for a child whose logged allocations were 771 MiB.
#: * ``hip``: 512 MiB, NOT measured — a conservative stand-in (no ROCm GPU has been measured yet;
#:   the ROCm runtime also keeps a per-process context and code objects on the device). The first
#:   child forge runs on an AMD GPU replaces it with the measured figure.
#: * ``cpu``: 0 (system RAM has no device context: the RSS is counted as it is).
DEVICE_CONTEXT_BYTES: dict[str, int] = {"cuda": 645 * _MIB, "hip": 512 * _MIB, "cpu": 0}
#: The backend forge runs on each GPU vendor (the build it prefers there).
_BACKEND_OF_VENDOR = {"nvidia": "cuda", "amd": "hip", "cpu": "cpu"}


def backend_of(device_key: str) -> str:
    """The backend whose children run on ``device_key`` (``nvidia:0`` → ``cuda``, ``amd:1`` → ``hip``)."""
    return _BACKEND_OF_VENDOR.get(device_key.partition(":")[0], "cpu")


def default_device_context(device_key: str) -> int:
    """:data:`DEVICE_CONTEXT_BYTES` of the backend that runs on ``device_key``."""
    return DEVICE_CONTEXT_BYTES.get(backend_of(device_key), 0)


def _pad(n: int, to: int = _PAD) -> int:
    return (n + to - 1) // to * to


def _row_bytes(cache_type: str, n: int) -> int:
    try:
        qtype = GGMLQuantizationType[cache_type.upper()]
    except KeyError:
        raise UsageError(
            f"unknown KV cache type {cache_type!r}", hint=f"use one of: {', '.join(CACHE_TYPES)}"
        ) from None
    block, size = GGML_QUANT_SIZES[qtype]
    return (n + block - 1) // block * size


def _parts_json(parts: DeviceEstimate | MemoryEstimate) -> dict[str, int]:
    """The parts on the wire, in one order and with one rule for a device and for the whole load."""
    return {
        "weights_bytes": parts.weights_bytes,
        "kv_bytes": parts.kv_bytes,
        "compute_bytes": parts.compute_bytes,
        "output_bytes": parts.output_bytes,
        "projector_bytes": parts.projector_bytes,
        **({"draft_bytes": parts.draft_bytes} if parts.draft_bytes else {}),  # speculative decoding
        **({"context_bytes": parts.context_bytes} if parts.context_bytes else {}),  # GPUs only
    }


@dataclass(frozen=True)
class DeviceEstimate:
    """What one device will hold, by part."""

    device: str
    weights_bytes: int = 0
    kv_bytes: int = 0
    compute_bytes: int = 0
    output_bytes: int = 0
    layers: int = 0
    """Repeating blocks placed here (the output layer is not counted)."""
    projector_bytes: int = 0
    """A multimodal projector's weights and compute buffer, on the device mtmd runs it on."""
    context_bytes: int = 0
    """The backend's per-process device context on this GPU (not an allocation the child logs)."""
    draft_bytes: int = 0
    """A speculative-decoding draft model here: its weights, KV cache, compute and output buffers."""

    @property
    def allocated_bytes(self) -> int:
        """What the child's own allocations will be here (what its log reports): all but the context."""
        return (
            self.weights_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes + self.projector_bytes
        ) + self.draft_bytes

    @property
    def total_bytes(self) -> int:
        return self.allocated_bytes + self.context_bytes

    def to_json(self) -> dict[str, int]:
        return {**_parts_json(self), "total_bytes": self.total_bytes, "layers": self.layers}


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimate for one load: per device, and the effective settings it assumed."""

    devices: tuple[DeviceEstimate, ...]
    n_gpu_layers: int
    ctx_size: int
    """The context llama.cpp will really allocate (rounded up to 256 per slot)."""
    parallel: int
    kv_unified: bool
    cache_type_k: str
    cache_type_v: str
    flash_attn: bool
    embeddings: bool = False
    """Every token of a ubatch is an output (``--embeddings``/``--pooling``)."""

    def device(self, key: str) -> DeviceEstimate:
        for d in self.devices:
            if d.device == key:
                return d
        return DeviceEstimate(device=key)

    def bytes_on(self, key: str) -> int:
        return self.device(key).total_bytes

    @property
    def by_device(self) -> dict[str, int]:
        return {d.device: d.total_bytes for d in self.devices}

    @property
    def weights_bytes(self) -> int:
        return sum(d.weights_bytes for d in self.devices)

    @property
    def kv_bytes(self) -> int:
        return sum(d.kv_bytes for d in self.devices)

    @property
    def compute_bytes(self) -> int:
        return sum(d.compute_bytes for d in self.devices)

    @property
    def output_bytes(self) -> int:
        return sum(d.output_bytes for d in self.devices)

    @property
    def projector_bytes(self) -> int:
        return sum(d.projector_bytes for d in self.devices)

    @property
    def context_bytes(self) -> int:
        return sum(d.context_bytes for d in self.devices)

    @property
    def draft_bytes(self) -> int:
        return sum(d.draft_bytes for d in self.devices)

    @property
    def total_bytes(self) -> int:
        return sum(d.total_bytes for d in self.devices)

    @property
    def ctx_per_request(self) -> int:
        """Tokens one request can use: the whole context with one shared cache, else a slot's share
        (llama-server's ``n_ctx_seq``, what its ``/props`` reports as ``n_ctx``)."""
        return self.ctx_size if self.kv_unified else self.ctx_size // max(1, self.parallel)

    @property
    def gpu_bytes(self) -> int:
        return sum(d.total_bytes for d in self.devices if d.device != "cpu")

    def to_json(self) -> dict[str, object]:
        return {
            "total_bytes": self.total_bytes,
            **_parts_json(self),
            "by_device": {d.device: d.to_json() for d in self.devices},
            "n_gpu_layers": self.n_gpu_layers,
            "ctx_size": self.ctx_size,
            "ctx_per_request": self.ctx_per_request,
            "parallel": self.parallel,
            "kv_unified": self.kv_unified,
            "cache_type_k": self.cache_type_k,
            "cache_type_v": self.cache_type_v,
            "flash_attn": self.flash_attn,
            "embeddings": self.embeddings,
        }


def _context(key: str, measured: Mapping[str, int] | None) -> int:
    if measured is not None and key in measured:
        return measured[key]
    return default_device_context(key)


def kv_bytes_per_token(
    info: GGUFInfo, *, cache_type_k: str = "f16", cache_type_v: str = "f16", full_layers_only: bool = False
) -> int:
    """KV bytes one more token of context costs, summed over layers (window layers optional)."""
    total = 0
    for il in range(info.block_count):
        if full_layers_only and info.swa_layers[il]:
            continue
        heads = info.head_count_kv[il]
        total += _row_bytes(cache_type_k, heads * info.key_length)
        total += _row_bytes(cache_type_v, heads * info.value_length)
    return total


def _layer_devices(
    n_layer: int, n_gpu_layers: int, gpus: Sequence[str], tensor_split: Sequence[float] | None
) -> list[str]:
    """The device of layers 0..n_layer (index n_layer is the output layer), as llama.cpp picks."""
    if not gpus:
        return ["cpu"] * (n_layer + 1)
    weights = list(tensor_split) if tensor_split and any(tensor_split) else [1.0] * len(gpus)
    if len(weights) != len(gpus):
        raise UsageError(
            f"tensor_split has {len(weights)} values for {len(gpus)} GPUs", hint="give one value per GPU"
        )
    total = sum(weights)
    points, acc = [], 0.0
    for w in weights:
        acc += w
        points.append(acc / total)
    i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)
    act = min(n_gpu_layers, n_layer + 1)
    out = []
    for il in range(n_layer + 1):
        if il < i_gpu_start or il - i_gpu_start >= act:
            out.append("cpu")
            continue
        g = bisect.bisect_right(points, (il - i_gpu_start) / act)
        out.append(gpus[min(g, len(gpus) - 1)])
    return out


def _compute_allowance(
    info: GGUFInfo,
    *,
    n_tokens: int,
    n_kv_full: int,
    n_kv_swa: int,
    flash_attn: bool,
) -> int:
    """Scratch memory of one ubatch (see module docstring for where the terms come from).

    Fitted on the real llama-server's ``compute buffer size`` (CPU) for gemma-3-270m and a tiny
    llama across context sizes, slots, ubatch sizes and flash attention on/off: the terms that
    grow with the context are exact (scores: ubatch × heads × cells × f32 without flash
    attention; one mask per attention kind, ubatch × cells, f32 or f16 with flash attention),
    the rest is a per-token allowance of feed-forward and projection activations.
    """
    n_ff = info.feed_forward_length or 4 * info.embedding_length
    q_dim = info.head_count * info.key_length
    per_token = 2 * n_ff + info.embedding_length + q_dim // 4
    if flash_attn:
        per_token += 4 * q_dim
        scores = 0
    else:
        scores = n_tokens * info.head_count * max(n_kv_full, n_kv_swa) * _F32
    masks = _masks(n_tokens=n_tokens, n_kv_full=n_kv_full, n_kv_swa=n_kv_swa, flash_attn=flash_attn)
    return n_tokens * per_token * _F32 + scores + masks


def _masks(*, n_tokens: int, n_kv_full: int, n_kv_swa: int, flash_attn: bool) -> int:
    """The attention masks of one ubatch, one per attention kind: ubatch × cells, f16 with flash
    attention, f32 without (both compute stages hold them)."""
    return n_tokens * (n_kv_full + n_kv_swa) * (2 if flash_attn else _F32)


def _every_token_output_stage(
    info: GGUFInfo, *, n_tokens: int, n_kv_full: int, n_kv_swa: int, flash_attn: bool
) -> int:
    """The compute peak at the output layer when every token of the ubatch is an output
    (embeddings): its logits, plus the masks and ~4 hidden-state rows per token still held there.

    Measured on the real llama-server (CPU): SmolLM2-135M 100.40 MiB (ub 512, -np 4), 105.89 MiB
    (-fa off, -np 1), 50.20 MiB (ub 256); gemma-3-270m 516.53, 525.27, 258.14 MiB; this gives
    104.5, 108.5, 50.8, 523.5, 527.0, 259.4 (all within 5 %).
    """
    masks = _masks(n_tokens=n_tokens, n_kv_full=n_kv_full, n_kv_swa=n_kv_swa, flash_attn=flash_attn)
    return n_tokens * (info.vocab_size + 4 * info.embedding_length) * _F32 + masks


def estimate_memory(
    info: GGUFInfo,
    *,
    n_gpu_layers: int | None,
    ctx_size: int,
    parallel: int | None,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    flash_attn: bool | None = None,
    devices: Sequence[str] = ("cpu",),
    tensor_split: Sequence[float] | None = None,
    n_ubatch: int = DEFAULT_N_UBATCH,
    kv_unified: bool | None = None,
    embeddings: bool = False,
    projector: ProjectorInfo | None = None,
    projector_offload: bool | None = None,
    repack: bool = True,
    device_context: Mapping[str, int] | None = None,
    draft: GGUFInfo | None = None,
    draft_on_gpu: bool = True,
    adapter_bytes: int = 0,
) -> MemoryEstimate:
    """Estimate the memory of one llama-server load, per device and part.

    ``devices`` are the GPUs the child will use, in its order (``("amd:0", "amd:1")``), or
    ``("cpu",)`` for none; the CPU is always there for what stays in system RAM.
    ``n_gpu_layers`` None or negative means all layers. ``ctx_size`` 0 means the trained
    context. ``parallel`` None means llama-server's auto (4 slots sharing one KV cache).
    ``flash_attn`` None is llama-server's auto, which turns it on where the backend supports it
    (all the backends we build). ``embeddings``: the child outputs every token (``--embeddings``,
    ``--reranking`` or a ``--pooling``; see the module docstring).     ``projector``: the model's ``--mmproj`` file, counted on the
    first GPU unless ``projector_offload`` is False (None: on, as llama-server's default) or no GPU
    is used. ``repack`` False (``--no-repack``): no CPU_REPACK copy of the weights on the CPU.
    ``device_context``: GPU key → the per-process device context measured there; a GPU not in it
    gets its backend's :func:`default_device_context`. ``draft``: a speculative-decoding draft
    model, counted as :func:`_draft_bytes` says (in RAM when ``draft_on_gpu`` is False).
    ``adapter_bytes``: LoRA adapters' files, as weights where their layers are (llama.cpp puts
    each adapter tensor in its base tensor's buffer), split by the layers each device holds.
    """
    gpus = [d for d in devices if d != "cpu"]
    n_layer = info.block_count
    ngl = n_layer + 1 if n_gpu_layers is None or n_gpu_layers < 0 else min(n_gpu_layers, n_layer + 1)
    if not gpus:
        ngl = 0
    if parallel is None or parallel <= 0:
        n_seq, unified = 4, True if kv_unified is None else kv_unified
    else:
        n_seq, unified = parallel, bool(kv_unified)
    fa = True if flash_attn is None else flash_attn
    if (cache_type_v.lower() not in ("f16", "f32", "bf16")) and not fa:
        raise UsageError(
            f"a quantized V cache ({cache_type_v}) needs flash attention",
            hint="add --flash-attn on, or use --cache-type-v f16",
        )

    ctx = ctx_size if ctx_size > 0 else (info.context_length or 4096)
    n_ctx = _pad(ctx)
    if unified:
        n_ctx_seq, n_stream = n_ctx, 1
    else:
        n_ctx_seq, n_stream = _pad(n_ctx // n_seq or 1), n_seq
        n_ctx = n_ctx_seq * n_seq
    window = info.sliding_window or 0
    swa_cells = _pad(min(n_ctx_seq, window * (n_seq if unified else 1) + n_ubatch)) if window else n_ctx_seq

    placement = _layer_devices(n_layer, ngl, gpus, tensor_split)
    weights: dict[str, int] = {}
    kv: dict[str, int] = {}
    layers: dict[str, int] = {}
    kinds: dict[str, set[bool]] = {}  # device → the attention kinds (window or not) of its layers
    for il in range(n_layer):
        dev = placement[il]
        weights[dev] = weights.get(dev, 0) + info.layer_bytes[il]
        if dev == "cpu" and repack and info.layer_repack_bytes:
            weights[dev] += info.layer_repack_bytes[il]
        layers[dev] = layers.get(dev, 0) + 1
        kinds.setdefault(dev, set()).add(info.swa_layers[il])
        cells = (swa_cells if info.swa_layers[il] else n_ctx_seq) * n_stream
        heads = info.head_count_kv[il]
        row = _row_bytes(cache_type_k, heads * info.key_length) + _row_bytes(
            cache_type_v, heads * info.value_length
        )
        kv[dev] = kv.get(dev, 0) + cells * row
    weights["cpu"] = weights.get("cpu", 0) + info.input_bytes
    for dev, n in layers.items():
        weights[dev] = weights.get(dev, 0) + adapter_bytes * n // max(n_layer, 1)
    out_dev = placement[n_layer]
    weights[out_dev] = weights.get(out_dev, 0) + info.output_bytes
    if out_dev == "cpu":
        # A tied head on the CPU is the embedding's own mapped file bytes, repacked or not: with
        # ``--no-repack`` (every child on an AMX CPU) nothing is added here at all.
        if repack:
            weights[out_dev] += info.output_repack_bytes
    elif info.output_tied:
        # A tied head is the embedding loaded again on the output layer's GPU.
        weights[out_dev] += info.embedding_bytes

    n_tokens = min(n_ubatch, n_ctx)
    compute: dict[str, int] = {}
    for dev in {*layers, out_dev}:
        dev_kinds = kinds.get(dev, set())
        kv_cells = {
            "n_kv_full": n_ctx_seq if False in dev_kinds else 0,
            "n_kv_swa": swa_cells if True in dev_kinds else 0,
        }
        compute[dev] = _compute_allowance(info, n_tokens=n_tokens, flash_attn=fa, **kv_cells)
        if embeddings and dev == out_dev:
            stage = _every_token_output_stage(info, n_tokens=n_tokens, flash_attn=fa, **kv_cells)
            compute[dev] = max(compute[dev], stage)
    if gpus and "cpu" not in compute:
        # Pinned host staging for the ubatch's inputs (``ROCm_Host`` / ``CUDA_Host`` compute buffer).
        compute["cpu"] = n_tokens * info.embedding_length * _F32 * 2
    # The logits the server reads back: one row per slot (``llama_context`` output buffer), and
    # with embeddings an embedding row per slot too.
    out_row = info.vocab_size + (info.embedding_length if embeddings else 0)
    output = {"cpu": n_seq * out_row * _F32}

    keys = ["cpu", *gpus]
    projector_on: dict[str, int] = {}
    if projector is not None:
        proj_dev = gpus[0] if gpus and projector_offload is not False else "cpu"
        projector_on[proj_dev] = projector.total_bytes
    draft_on: dict[str, int] = {}
    if draft is not None:
        draft_est = estimate_memory(
            draft,
            n_gpu_layers=None if gpus and draft_on_gpu else 0,
            ctx_size=n_ctx,
            parallel=n_seq,
            kv_unified=unified,
            flash_attn=fa,
            devices=tuple(gpus) if draft_on_gpu and gpus else ("cpu",),
            tensor_split=tensor_split,
            n_ubatch=n_ubatch,
            repack=repack,
        )
        draft_on = _draft_bytes(draft_est)
    per_device = tuple(
        DeviceEstimate(
            device=k,
            weights_bytes=weights.get(k, 0),
            kv_bytes=kv.get(k, 0),
            compute_bytes=compute.get(k, 0),
            output_bytes=output.get(k, 0),
            layers=layers.get(k, 0),
            projector_bytes=projector_on.get(k, 0),
            draft_bytes=draft_on.get(k, 0),
            context_bytes=_context(k, device_context) if k in gpus else 0,
        )
        for k in keys
    )
    return MemoryEstimate(
        devices=per_device,
        n_gpu_layers=ngl,
        ctx_size=n_ctx,
        parallel=n_seq,
        kv_unified=unified,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        flash_attn=fa,
        embeddings=embeddings,
    )


def _draft_bytes(est: MemoryEstimate) -> dict[str, int]:
    """A draft model's allocations per device. llama-server (``common_base_params_to_speculative``)
    gives the draft the target's context, slots, unified cache, ubatch and tensor split, its own
    ``f16`` cache (``--spec-draft-type-k/-v``) and one output row per slot: a second load of the
    same shape, whose device context is the target's (one process)."""
    return {d.device: d.allocated_bytes for d in est.devices if d.allocated_bytes}
