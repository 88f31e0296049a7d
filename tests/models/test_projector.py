"""Multimodal projectors (``mmproj``): read, chosen, counted in the estimate, and measured for real.

The projector is the random-weight CLIP GGUF the tests write (tests/support/tiny_clip.py), which
the real llama-server's mtmd loads beside the tiny text model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmforge_supervisor._errors import InvalidModelFile, ModelNotFound
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.models import (
    AllocationLedger,
    choose_projector,
    estimate_memory,
    inspect_gguf,
    inspect_projector,
)
from rocmforge_supervisor.supervisor._local import LoadOptions, plan_local_load
from tests.models.test_estimate_real import _actual
from tests.support.tiny_clip import write_tiny_audio_clip, write_tiny_clip

MIB = 1024 * 1024


def _mmproj(vision_model: Path) -> Path:
    return vision_model.with_name("mmproj-tiny-vision.gguf")


def test_a_projector_says_what_it_takes_and_weighs(vision_model: Path) -> None:
    p = inspect_projector(_mmproj(vision_model))
    assert p.modalities == ("vision",)
    assert p.projector_type == "mlp"
    assert (p.image_size, p.patch_size, p.block_count) == (32, 8, 2)
    assert 0 < p.weights_bytes <= p.file_size_bytes
    assert p.compute_bytes > 0


def test_an_audio_projector_says_audio(tmp_path: Path) -> None:
    p = inspect_projector(write_tiny_audio_clip(tmp_path / "mmproj-audio.gguf"))
    assert p.modalities == ("audio",) and p.projector_type == "ultravox"
    assert p.compute_bytes > 1500 * 1500 * 4  # one 30 s chunk's attention scores at least


def test_a_text_model_given_as_projector_is_refused(vision_model: Path) -> None:
    with pytest.raises(InvalidModelFile, match=r"is not a multimodal projector: its architecture is 'llama'"):
        inspect_projector(vision_model)


def test_a_missing_projector_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match=r"no projector file at"):
        inspect_projector(tmp_path / "mmproj-gone.gguf")


@pytest.mark.parametrize(
    ("files", "model", "chosen"),
    [
        (["m-Q4_K_M.gguf", "mmproj-m-f16.gguf"], "m-Q4_K_M.gguf", "mmproj-m-f16.gguf"),
        (["m-Q8_0.gguf", "mmproj-m-Q8_0.gguf", "mmproj-m-f16.gguf"], "m-Q8_0.gguf", "mmproj-m-Q8_0.gguf"),
        (["m-Q4_K_M.gguf", "mmproj-m-Q8_0.gguf", "mmproj-m-f16.gguf"], "m-Q4_K_M.gguf", "mmproj-m-f16.gguf"),
        (["m-Q4_K_M.gguf", "mmproj-m-BF16.gguf", "mmproj-m-F32.gguf"], "m-Q4_K_M.gguf", "mmproj-m-BF16.gguf"),
        (["a/m-Q4.gguf", "a/mmproj.gguf", "b/mmproj-f16.gguf"], "a/m-Q4.gguf", "a/mmproj.gguf"),
        (["m-Q4_K_M.gguf", "README.md"], "m-Q4_K_M.gguf", None),
    ],
)
def test_the_projector_beside_a_model_is_chosen(files: list[str], model: str, chosen: str | None) -> None:
    assert choose_projector(files, model)[0] == chosen


def test_the_estimate_counts_the_projector_where_it_will_run(vision_model: Path) -> None:
    info = inspect_gguf(vision_model)
    p = inspect_projector(_mmproj(vision_model))
    base = estimate_memory(info, n_gpu_layers=None, ctx_size=512, parallel=1, devices=("amd:0", "amd:1"))
    on_gpu = estimate_memory(
        info, n_gpu_layers=None, ctx_size=512, parallel=1, devices=("amd:0", "amd:1"), projector=p
    )
    assert on_gpu.device("amd:0").projector_bytes == p.weights_bytes + p.compute_bytes
    assert on_gpu.bytes_on("amd:0") - base.bytes_on("amd:0") == p.total_bytes
    assert on_gpu.bytes_on("amd:1") == base.bytes_on("amd:1")
    in_ram = estimate_memory(
        info,
        n_gpu_layers=None,
        ctx_size=512,
        parallel=1,
        devices=("amd:0",),
        projector=p,
        projector_offload=False,
    )
    assert in_ram.device("cpu").projector_bytes == p.total_bytes
    assert in_ram.device("amd:0").projector_bytes == 0
    assert in_ram.to_json()["projector_bytes"] == p.total_bytes


def test_the_ledger_reads_the_projector_lines_without_dropping_the_model() -> None:
    lines = [
        "load_tensors:        ROCm0 model buffer size =   100.00 MiB",
        "llama_kv_cache:        ROCm0 KV buffer size =    10.00 MiB",
        "sched_reserve:        ROCm0 compute buffer size =    5.00 MiB",
        "clip_ctx: CLIP using ROCm0 backend",
        "load_hparams: model size:         90.50 MiB",
        "reserve_compute_meta:      ROCm0 compute buffer size =     20.00 MiB",
        "reserve_compute_meta:        CPU compute buffer size =     1.00 MiB",
    ]
    ledger = AllocationLedger(gpu_keys=["amd:1"]).feed_all(lines)
    parts = ledger.by_device()
    assert parts["amd:1"] == {
        "weights": 100 * MIB,
        "kv": 10 * MIB,
        "compute": 5 * MIB,
        "projector": 110.5 * MIB,
    }
    assert parts["cpu"] == {"projector": 1 * MIB}


def test_a_load_plan_passes_the_projector_and_keeps_it_in_ram_on_the_cpu(
    vision_model: Path, state_settings: ForgeSettings
) -> None:
    plan = plan_local_load(vision_model, LoadOptions(mmproj="auto", ctx_size=512, parallel=1), state_settings)
    args = plan.spec.extra_args
    assert args[args.index("--mmproj") + 1] == str(_mmproj(vision_model))
    # On the CPU: without this flag mtmd would put the projector on a GPU of its own choosing.
    assert "--no-mmproj-offload" in args
    assert plan.projector is not None and plan.estimate.device("cpu").projector_bytes > 0
    plain = plan_local_load(vision_model, LoadOptions(ctx_size=512, parallel=1), state_settings)
    assert "--mmproj" not in plain.spec.extra_args and plain.estimate.projector_bytes == 0


def test_a_load_plan_refuses_a_bad_projector_before_any_spawn(
    vision_model: Path, tiny_gguf: Path, tmp_path: Path, state_settings: ForgeSettings
) -> None:
    with pytest.raises(InvalidModelFile, match=r"is not a multimodal projector"):
        plan_local_load(vision_model, LoadOptions(mmproj=str(tiny_gguf)), state_settings)
    with pytest.raises(ModelNotFound, match=r"no projector file at .*nope.gguf"):
        plan_local_load(vision_model, LoadOptions(mmproj=str(tmp_path / "nope.gguf")), state_settings)
    with pytest.raises(ModelNotFound, match=r'mmproj = "auto" found no projector'):
        plan_local_load(tiny_gguf, LoadOptions(mmproj="auto"), state_settings)


def test_the_estimate_covers_what_the_real_child_allocated_for_the_projector(
    llama_server_bin: Path, vision_model: Path, tmp_path: Path
) -> None:
    wide = write_tiny_clip(tmp_path / "mmproj-wide.gguf")
    p = inspect_projector(wide)
    ledger = _actual(
        llama_server_bin,
        vision_model,
        ["--mmproj", str(wide), "--no-mmproj-offload", "-c", "512", "-np", "1", "--device", "none"],
    )
    actual = ledger.part_totals().get("projector", 0)
    assert actual > 0, "the child printed no projector allocation lines"
    # The weights are the file's tensors exactly (to the 0.01 MiB the log prints); the compute
    # buffer is an allowance that must cover the child's.
    assert abs(actual - p.total_bytes) < p.total_bytes
    assert p.total_bytes >= actual
    assert ledger.part_totals().get("weights", 0) > 0  # the model's own lines were kept
