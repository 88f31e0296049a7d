"""Speculative decoding's pure parts: the draft's flags on the child's command line, its memory in
the estimate (and so in placement), its allocations in the ledger, and its vocabulary checked
before anything starts. The real child drafting is tests/gateway/test_speculative_real.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rocmforge_supervisor._errors import ConfigError
from rocmforge_supervisor.config import ForgeConfig, ForgeSettings
from rocmforge_supervisor.hardware import detect
from rocmforge_supervisor.models import AllocationLedger, estimate_memory, inspect_gguf, vocab_mismatch
from rocmforge_supervisor.supervisor.launch._launch import (
    ModelSpec,
    ResolvedDraft,
    ResolvedModel,
    build_plan,
    decide,
    resolve,
)

_MIB = 1024**2


def _plan(
    spec: ModelSpec, gguf: Path, config: ForgeConfig, tmp_path: Path, draft: ResolvedDraft | None
) -> tuple[list[str], int, int]:
    """(argv, the estimate's draft bytes, its total) of ``spec`` placed on the config's machine."""
    model = ResolvedModel(gguf, inspect_gguf(gguf), draft=draft)
    inventory = detect(config.settings)
    decision = decide(spec, "m", model, inventory)
    plan = build_plan(
        spec,
        "m",
        model,
        decision,
        inventory,
        config.settings,
        binary=Path("llama-server"),
        log_path=tmp_path / "m.log",
        state_dir=tmp_path,
    )
    return (
        plan.spec.args(8080, tmp_path / "key"),
        decision.estimate.draft_bytes,
        decision.estimate.total_bytes,
    )


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_a_draft_goes_on_the_command_line_with_draft_simple(
    tiny_gguf: Path, make_config: Callable[..., ForgeConfig], tmp_path: Path
) -> None:
    """The pinned llama-server never drafts with --spec-draft-model alone (its types default to
    none): forge names draft-simple, and the sizes the keys give."""
    draft = ResolvedDraft(tiny_gguf, inspect_gguf(tiny_gguf))
    spec = ModelSpec(
        path=str(tiny_gguf),
        ctx_size=1024,
        parallel=1,
        gpu="cpu",
        draft=str(tiny_gguf),
        draft_max=8,
        draft_min=2,
    )
    argv, draft_bytes, _ = _plan(spec, tiny_gguf, make_config({}), tmp_path, draft)
    assert _after(argv, "--spec-draft-model") == str(tiny_gguf)
    assert _after(argv, "--spec-type") == "draft-simple"
    assert (_after(argv, "--spec-draft-n-max"), _after(argv, "--spec-draft-n-min")) == ("8", "2")
    # on the CPU the draft is given no device, as the model
    assert _after(argv, "--spec-draft-device") == "none" and _after(argv, "--spec-draft-ngl") == "0"
    assert draft_bytes > 0

    plain, no_draft, _ = _plan(
        ModelSpec(path=str(tiny_gguf), ctx_size=1024, gpu="cpu"), tiny_gguf, make_config({}), tmp_path, None
    )
    assert not any(a.startswith("--spec") for a in plain) and no_draft == 0


def test_speculative_types_and_an_mtp_draft(
    tiny_gguf: Path, make_config: Callable[..., ForgeConfig], tmp_path: Path
) -> None:
    cfg = make_config({})
    ngram = ModelSpec(path=str(tiny_gguf), ctx_size=1024, gpu="cpu", speculative=("ngram-mod",))
    argv, draft_bytes, _ = _plan(ngram, tiny_gguf, cfg, tmp_path, None)
    assert _after(argv, "--spec-type") == "ngram-mod" and "--spec-draft-model" not in argv
    assert draft_bytes == 0
    # a draft whose GGUF names its own type (MTP head, DFlash): llama-server reads it from the file
    declared = ResolvedDraft(tiny_gguf, inspect_gguf(tiny_gguf), declares_type=True)
    spec = ModelSpec(path=str(tiny_gguf), ctx_size=1024, gpu="cpu", draft=str(tiny_gguf))
    argv, _, _ = _plan(spec, tiny_gguf, cfg, tmp_path, declared)
    assert "--spec-draft-model" in argv and "--spec-type" not in argv


def test_the_draft_is_in_the_estimate_where_it_sits(smollm2_path: Path) -> None:
    """On a GPU (auto) the draft's layers and KV cache are on the model's GPUs; ``draft_gpu =
    "cpu"`` puts them in RAM. Either way the draft's share is its own load's allocations at the
    model's context and slots (a second, same-shaped llama context)."""
    info = inspect_gguf(smollm2_path)
    shape = {"ctx_size": 4096, "parallel": 2, "kv_unified": True}
    alone = estimate_memory(info, n_gpu_layers=None, devices=("amd:0",), **shape)
    both = estimate_memory(info, n_gpu_layers=None, devices=("amd:0",), draft=info, **shape)
    on_gpu = both.device("amd:0").draft_bytes
    assert on_gpu > alone.device("amd:0").kv_bytes  # the draft's weights and its own KV cache
    assert on_gpu == alone.device("amd:0").allocated_bytes
    assert both.device("amd:0").total_bytes == alone.device("amd:0").total_bytes + on_gpu
    assert both.device("amd:0").context_bytes == alone.device("amd:0").context_bytes  # one process
    in_ram = estimate_memory(
        info, n_gpu_layers=None, devices=("amd:0",), draft=info, draft_on_gpu=False, **shape
    )
    assert in_ram.device("amd:0").draft_bytes == 0 and in_ram.device("cpu").draft_bytes > on_gpu // 2
    assert both.to_json()["draft_bytes"] == both.draft_bytes > 0


def test_placement_counts_the_draft(
    smollm2_path: Path, make_config: Callable[..., ForgeConfig], tmp_path: Path
) -> None:
    """On a GPU machine the draft's bytes are in what placement needs on the model's GPU, and the
    child is told to put the draft there (all its layers)."""
    cfg = make_config({}, machine="rx7900xtx")
    draft = ResolvedDraft(smollm2_path, inspect_gguf(smollm2_path))
    spec = ModelSpec(path=str(smollm2_path), ctx_size=4096, parallel=1, draft=str(smollm2_path))
    argv, draft_bytes, total = _plan(spec, smollm2_path, cfg, tmp_path, draft)
    _, _, without = _plan(
        ModelSpec(path=str(smollm2_path), ctx_size=4096, parallel=1), smollm2_path, cfg, tmp_path, None
    )
    assert draft_bytes > 90 * _MIB and total == without + draft_bytes
    assert _after(argv, "--spec-draft-ngl") == "all" and "--spec-draft-device" not in argv


#: What the real llama-server (4df29be, CPU) printed for SmolLM2-135M with itself as the draft.
_LOG = """\
load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
llama_context:        CPU  output buffer size =     0.19 MiB
llama_kv_cache:        CPU KV buffer size =    22.50 MiB
sched_reserve:        CPU compute buffer size =    14.51 MiB
common_speculative_init_result: loading draft model '/models/SmolLM2-135M-Instruct.Q4_1.gguf'
load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
llama_context:        CPU  output buffer size =     0.19 MiB
llama_kv_cache:        CPU KV buffer size =    22.50 MiB
sched_reserve:        CPU compute buffer size =    14.51 MiB
"""


def test_the_ledger_counts_the_drafts_allocations_as_its_own_part() -> None:
    """The draft's load prints the same lines after the model's: its weights line must not be
    taken for a new load of the model (which dropped the model's own allocations)."""
    ledger = AllocationLedger().feed_all(_LOG.splitlines())
    parts = ledger.part_totals()
    assert parts["weights"] == round(92.10 * _MIB)
    assert parts["draft"] == round((92.10 + 0.19 + 22.50 + 14.51) * _MIB)
    assert ledger.total_bytes == 2 * parts["draft"]


def test_a_draft_with_another_vocabulary_is_refused_before_the_start(
    smollm2_path: Path, gemma_path: Path, tmp_path: Path
) -> None:
    """gemma-3-270m cannot draft for SmolLM2 (another tokenizer): llama-server would load both
    and serve without drafting; forge refuses at resolve (the load's first step)."""
    assert vocab_mismatch(smollm2_path, smollm2_path) is None
    assert vocab_mismatch(smollm2_path, gemma_path) == "its tokenizer is 'llama', the model's is 'gpt2'"
    settings = ForgeSettings(state_dir=tmp_path, config_home=tmp_path)
    spec = ModelSpec(path=str(smollm2_path), draft=str(gemma_path))
    with pytest.raises(ConfigError) as e:
        resolve(spec, settings)
    message = str(e.value)
    assert "gemma-3-270m-q4_k_m.gguf does not share the vocabulary of SmolLM2" in message
    assert "never draft" in message and "same family" in message and "\n" not in message
    ok = resolve(ModelSpec(path=str(smollm2_path), draft=str(smollm2_path)), settings)
    assert ok.draft is not None and ok.draft.path == smollm2_path and not ok.draft.declares_type
