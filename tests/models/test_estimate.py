"""The estimate's arithmetic, checked by hand against llama.cpp's rules (the real-binary comparison
is in test_estimate_real.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmforge_supervisor._errors import UsageError
from rocmforge_supervisor.models import estimate_memory, inspect_gguf, kv_bytes_per_token
from rocmforge_supervisor.models._gguf import GGUFInfo

from .conftest import LLAMA_8B, MIB


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> GGUFInfo:
    return inspect_gguf(gemma_path)


def test_kv_cache_by_hand(gemma: GGUFInfo) -> None:
    # 3 full layers × 4096 cells + 15 window layers × pad256(512 + 512) cells; 1 KV head × 256 × f16, K and V.
    est = estimate_memory(gemma, n_gpu_layers=0, ctx_size=4096, parallel=1)
    row = 2 * 256 * 2
    assert est.kv_bytes == 3 * 4096 * row + 15 * 1024 * row
    assert est.ctx_size == 4096 and not est.kv_unified


def test_window_layers_do_not_grow_with_context(gemma: GGUFInfo) -> None:
    small = estimate_memory(gemma, n_gpu_layers=0, ctx_size=8192, parallel=1)
    big = estimate_memory(gemma, n_gpu_layers=0, ctx_size=16384, parallel=1)
    # only the 3 full-attention layers pay for the extra 8192 tokens
    assert big.kv_bytes - small.kv_bytes == 3 * 8192 * 1024
    assert kv_bytes_per_token(gemma, full_layers_only=True) == 3 * 1024
    assert kv_bytes_per_token(gemma) == 18 * 1024


def test_context_rounding_and_slots(gemma: GGUFInfo) -> None:
    assert estimate_memory(gemma, n_gpu_layers=0, ctx_size=1000, parallel=1).ctx_size == 1024
    # 3 slots of 4096: each gets pad256(1365) = 1536 cells, so 4608 in all (llama_context's rule)
    est = estimate_memory(gemma, n_gpu_layers=0, ctx_size=4096, parallel=3)
    assert est.ctx_size == 4608 and est.parallel == 3
    # auto slots: 4, sharing one cache of the whole context; window cells = pad256(512 × 4 + 512)
    auto = estimate_memory(gemma, n_gpu_layers=0, ctx_size=8192, parallel=None)
    assert auto.kv_unified and auto.parallel == 4
    assert auto.kv_bytes == 3 * 8192 * 1024 + 15 * 2560 * 1024
    # 0 means the trained context
    assert estimate_memory(gemma, n_gpu_layers=0, ctx_size=0, parallel=1).ctx_size == 32768


def test_quantized_cache(gemma: GGUFInfo) -> None:
    f16 = estimate_memory(gemma, n_gpu_layers=0, ctx_size=4096, parallel=1, flash_attn=True)
    q8 = estimate_memory(
        gemma,
        n_gpu_layers=0,
        ctx_size=4096,
        parallel=1,
        cache_type_k="q8_0",
        cache_type_v="q8_0",
        flash_attn=True,
    )
    assert q8.kv_bytes * 512 == f16.kv_bytes * 272  # q8_0: 34 bytes per 32 values, f16: 64
    with pytest.raises(UsageError, match="needs flash attention"):
        estimate_memory(
            gemma, n_gpu_layers=0, ctx_size=4096, parallel=1, cache_type_v="q4_0", flash_attn=False
        )
    with pytest.raises(UsageError, match="unknown KV cache type"):
        estimate_memory(gemma, n_gpu_layers=0, ctx_size=4096, parallel=1, cache_type_k="q3")


@pytest.mark.parametrize("model", ["gemma", "smollm2", "tiny"])
@pytest.mark.parametrize("repack", [True, False], ids=["repack", "no-repack"])
def test_weights_on_the_cpu_are_the_file_plus_the_repacked_copy(
    model: str, repack: bool, gemma_path: Path, smollm2_path: Path, tiny_gguf: Path
) -> None:
    """On the CPU the weights are the mapped file's tensors, plus the CPU_REPACK copy of the
    repackable ones unless ``--no-repack`` (every child on an AMX CPU). A tied output head adds
    nothing there either way: it is the embedding's own mapped bytes. (The estimate once counted
    the embedding a second time with ``--no-repack``: +170 MiB, +72 %, for gemma-3-270m.)"""
    info = inspect_gguf({"gemma": gemma_path, "smollm2": smollm2_path, "tiny": tiny_gguf}[model])
    est = estimate_memory(info, n_gpu_layers=0, ctx_size=2048, parallel=1, repack=repack)
    copy = sum(info.layer_repack_bytes) + info.output_repack_bytes if repack else 0
    assert est.weights_bytes == info.tensor_bytes + copy
    assert est.device("cpu").weights_bytes == est.weights_bytes


def test_full_offload_keeps_the_embedding_on_the_cpu(gemma: GGUFInfo) -> None:
    est = estimate_memory(gemma, n_gpu_layers=None, ctx_size=4096, parallel=1, devices=("amd:0",))
    assert est.n_gpu_layers == 19  # 18 blocks + the output layer
    cpu, gpu = est.device("cpu"), est.device("amd:0")
    assert cpu.weights_bytes == gemma.input_bytes and cpu.kv_bytes == 0 and cpu.layers == 0
    # the tied head is a second copy of the embedding on the GPU
    assert gpu.weights_bytes == sum(gemma.layer_bytes) + gemma.output_bytes + gemma.embedding_bytes
    assert gpu.kv_bytes == est.kv_bytes and gpu.layers == 18
    assert est.bytes_on("nvidia:3") == 0


def test_partial_offload_follows_llama_cpp(gemma: GGUFInfo) -> None:
    # -ngl 10 of 19: the last 10 layers (blocks 9..17 and the output) go to the GPU
    est = estimate_memory(gemma, n_gpu_layers=10, ctx_size=4096, parallel=1, devices=("amd:0",))
    gpu, cpu = est.device("amd:0"), est.device("cpu")
    assert gpu.layers == 9 and cpu.layers == 9
    assert gpu.weights_bytes == sum(gemma.layer_bytes[9:]) + gemma.output_bytes + gemma.embedding_bytes
    # CPU blocks count their mapped bytes plus the CPU backend's repacked copy (Q4_K here)
    assert sum(gemma.layer_repack_bytes[:9]) > 0
    assert (
        cpu.weights_bytes
        == sum(gemma.layer_bytes[:9]) + sum(gemma.layer_repack_bytes[:9]) + gemma.input_bytes
    )
    # -ngl 18 (= n_layer) leaves block 0 on the CPU and puts the output layer on the GPU
    est18 = estimate_memory(gemma, n_gpu_layers=18, ctx_size=4096, parallel=1, devices=("amd:0",))
    assert est18.device("cpu").layers == 1 and est18.device("amd:0").layers == 17
    assert est18.device("amd:0").weights_bytes > sum(gemma.layer_bytes[1:])
    # no GPU: everything on the CPU whatever -ngl says
    cpu_only = estimate_memory(gemma, n_gpu_layers=99, ctx_size=4096, parallel=1)
    assert cpu_only.n_gpu_layers == 0 and [d.device for d in cpu_only.devices] == ["cpu"]


def test_tensor_split_over_two_gpus() -> None:
    est = estimate_memory(
        LLAMA_8B,
        n_gpu_layers=None,
        ctx_size=8192,
        parallel=1,
        devices=("amd:0", "amd:1"),
        tensor_split=[1, 1],
    )
    a, b = est.device("amd:0"), est.device("amd:1")
    # layers 0..16 (il/33 < 0.5) on the first GPU; 17..31 and the output on the second
    assert (a.layers, b.layers) == (17, 15)
    assert a.weights_bytes == 17 * 124 * MIB
    assert b.weights_bytes == 15 * 124 * MIB + 411 * MIB
    assert a.kv_bytes == 17 * 8192 * 8 * 128 * 2 * 2
    uneven = estimate_memory(
        LLAMA_8B,
        n_gpu_layers=None,
        ctx_size=8192,
        parallel=1,
        devices=("amd:0", "amd:1"),
        tensor_split=[3, 1],
    )
    assert uneven.device("amd:0").layers == 25  # il/33 < 0.75
    with pytest.raises(UsageError, match="tensor_split has 3 values for 2 GPUs"):
        estimate_memory(
            LLAMA_8B,
            n_gpu_layers=None,
            ctx_size=8192,
            parallel=1,
            devices=("a:0", "a:1"),
            tensor_split=[1, 1, 1],
        )


def test_flash_attention_off_pays_for_the_scores(gemma: GGUFInfo) -> None:
    on = estimate_memory(gemma, n_gpu_layers=0, ctx_size=16384, parallel=1, flash_attn=True)
    off = estimate_memory(gemma, n_gpu_layers=0, ctx_size=16384, parallel=1, flash_attn=False)
    # 512 tokens × 4 heads × 16384 cells × f32 of scores, and f32 instead of f16 masks
    assert off.compute_bytes - on.compute_bytes > 512 * 4 * 16384 * 4
    assert on.kv_bytes == off.kv_bytes


def test_json_shape(gemma: GGUFInfo) -> None:
    data = estimate_memory(gemma, n_gpu_layers=None, ctx_size=2048, parallel=2, devices=("amd:0",)).to_json()
    by_device = data["by_device"]
    assert isinstance(by_device, dict)
    assert data["total_bytes"] == sum(d["total_bytes"] for d in by_device.values())
    for key in ("weights_bytes", "kv_bytes", "compute_bytes", "output_bytes", "ctx_size", "parallel"):
        assert key in data
