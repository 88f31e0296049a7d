"""``forge pull org/repo --fit``: the quants of a repository on the local stand-in hub, each
described from its GGUF header (range requests, no download), placed on a fixture GPU machine whose
free memory is set small, and the largest that fits pulled — or only shown with ``--dry-run``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest

from rocmforge_supervisor._errors import HubError
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.models import inspect_gguf
from rocmforge_supervisor.models._fit import hub_quants
from tests.hardware.conftest import FIXTURES
from tests.support.tiny_clip import write_tiny_clip

from .conftest import copy_gguf
from .hub_standin import StandinHub, StandinRepo, running_hub

FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]
MIB = 1024**2
#: Free VRAM on the fixture GPU: the 256 MiB placement keeps back, the GPU backend's 512 MiB
#: context, and room for the split Q6_K (28 MiB of weights) but not for Q8_0 (56 MiB).
FREE_BYTES = (256 + 512 + 160) * MIB


def write_quant(path: Path, weights_mib: int) -> Path:
    """A small llama GGUF whose feed-forward weights take about ``weights_mib`` MiB (zeros): one
    "quantization" of the same model, by size."""
    n_embd, n_layer, vocab = 64, 2, 256
    n_ff = weights_mib * MIB // (3 * n_embd * 4 * n_layer)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("fit-test")
    w.add_context_length(8192)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([1] * vocab)
    w.add_tensor("token_embd.weight", np.zeros((vocab, n_embd), np.float32))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, np.float32))
        for t, rows in (("attn_q", n_embd), ("attn_k", n_embd // 2), ("attn_v", n_embd // 2)):
            w.add_tensor(f"blk.{i}.{t}.weight", np.zeros((rows, n_embd), np.float32))
        w.add_tensor(f"blk.{i}.attn_output.weight", np.zeros((n_embd, n_embd), np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", np.zeros((n_ff, n_embd), np.float32))
        w.add_tensor(f"blk.{i}.ffn_up.weight", np.zeros((n_ff, n_embd), np.float32))
        w.add_tensor(f"blk.{i}.ffn_down.weight", np.zeros((n_embd, n_ff), np.float32))
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def quants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Four sizes of one model, as a repo names them: 4, 16, 56 and 120 MiB of weights."""
    d = tmp_path_factory.mktemp("quants")
    sizes = {"Q2_K": 4, "Q4_K_M": 16, "Q8_0": 56, "F16": 120}
    return {q: write_quant(d / f"fit-{q}.gguf", mib).read_bytes() for q, mib in sizes.items()}


@pytest.fixture(scope="module")
def split_q6(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """A 28 MiB quant in two parts (gguf-split's names): one candidate, larger than Q4_K_M."""
    d = tmp_path_factory.mktemp("split")
    src = write_quant(d / "src.gguf", 28)
    parts = copy_gguf(src, d / "fit-Q6_K.gguf", max_tensors=12)
    assert len(parts) == 2
    return [p.read_bytes() for p in parts]


@pytest.fixture(scope="module")
def clip_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_tiny_clip(tmp_path_factory.mktemp("clip") / "mmproj.gguf").read_bytes()


@pytest.fixture
def hub(quants: dict[str, bytes], split_q6: list[bytes], clip_bytes: bytes) -> Iterator[StandinHub]:
    files = {f"fit-{q}.gguf": b for q, b in quants.items()}
    files |= {f"fit-Q6_K-0000{i}-of-00002.gguf": b for i, b in enumerate(split_q6, 1)}
    standin = StandinHub(
        repos={
            "org/fit-GGUF": StandinRepo(files={**files, "README.md": b"# fit\n"}),
            "org/vision-GGUF": StandinRepo(files={**files, "mmproj-fit-F16.gguf": clip_bytes}),
            "org/mirror-GGUF": StandinRepo(files=dict(files), ignore_range=True),
            "org/safetensors-only": StandinRepo(files={"model.safetensors": b"{}", "config.json": b"{}"}),
        }
    )
    with running_hub(standin) as running:
        yield running


@pytest.fixture
def machine(tmp_path: Path) -> Path:
    """The RX 7900 XTX fixture with FREE_BYTES of its VRAM free."""
    root = tmp_path / "machine"
    shutil.copytree(FIXTURES / "rx7900xtx", root, symlinks=True)
    [used] = root.rglob("mem_info_vram_used")
    total = int(used.with_name("mem_info_vram_total").read_text())
    used.write_text(f"{total - FREE_BYTES}\n")
    return root


@pytest.fixture
def env(tmp_path: Path, machine: Path, hub: StandinHub) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "FORGE_"))}
    e.update(
        COLUMNS="250",
        NO_COLOR="1",
        XDG_CONFIG_HOME=str(tmp_path / "xdg"),
        FORGE_STATE_DIR=str(tmp_path / "state"),
        FORGE_CACHE_DIR=str(tmp_path / "cache"),
        FORGE_SYSFS_ROOT=str(machine / "sys"),
        FORGE_DEV_ROOT=str(machine / "dev"),
        FORGE_USE_AMDSMI="0",
        FORGE_USE_NVML="0",
        FORGE_ENABLE_IGPU="0",
        HF_HUB_CACHE=str(tmp_path / "hf"),
        FORGE_HF_ENDPOINT=hub.url,
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    for k in ("ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        e.pop(k, None)
    return e


def forge_pull(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FORGE, "pull", *args], capture_output=True, text=True, env=env, timeout=120)


def downloaded(env: dict[str, str]) -> list[str]:
    return sorted(p.name for p in Path(env["HF_HUB_CACHE"]).rglob("*.gguf"))


def gguf_gets(hub: StandinHub) -> list[tuple[str, str | None]]:
    return [(p, rng) for m, p, rng in hub.requests if m == "GET" and p.endswith(".gguf")]


def test_dry_run_prints_the_candidates_and_downloads_nothing(env: dict[str, str], hub: StandinHub) -> None:
    r = forge_pull(env, "org/fit-GGUF", "--fit", "--dry-run")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "org/fit-GGUF: 5 GGUF model(s), ctx 4096, on amd:0 (AMD Radeon RX 7900 XTX) 928 MiB free" in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│ ")}
    assert list(rows) == ["Q2_K", "Q4_K_M", "Q6_K (pick)", "Q8_0", "F16"]  # by size; the split one once
    assert "yes: fits on amd:0" in rows["Q6_K (pick)"] and "amd:0 6" in rows["Q6_K (pick)"]
    assert "no: it needs 7" in rows["Q8_0"] and "MiB on amd:0 (weights 56 MiB" in rows["Q8_0"]
    assert "pick: Q6_K, the largest that fits; would pull org/fit-GGUF:Q6_K" in out
    # headers only: every GET of a GGUF asked for a range, and none of them was a download
    assert gguf_gets(hub) and all(rng is not None and rng.startswith("bytes=0-") for _, rng in gguf_gets(hub))
    assert downloaded(env) == []


def test_fit_pulls_the_pick_with_every_part(env: dict[str, str], hub: StandinHub) -> None:
    r = forge_pull(env, "org/fit-GGUF", "--fit")
    assert r.returncode == 0, r.stderr
    assert "pick: Q6_K, the largest that fits; pulling org/fit-GGUF:Q6_K" in r.stderr  # the table: stderr
    paths = r.stdout.strip().splitlines()
    assert [Path(p).name for p in paths] == [f"fit-Q6_K-0000{i}-of-00002.gguf" for i in (1, 2)]
    assert downloaded(env) == [Path(p).name for p in paths]
    assert inspect_gguf(Path(paths[0])).file_size_bytes == sum(Path(p).stat().st_size for p in paths)
    assert "use it as: forge load hf:org/fit-GGUF:Q6_K" in r.stderr


def test_the_projector_the_pull_takes_counts(env: dict[str, str]) -> None:
    plain = json.loads(forge_pull(env, "org/fit-GGUF", "--fit", "--dry-run", "--json").stdout)
    r = forge_pull(env, "org/vision-GGUF", "--fit", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    vision = json.loads(r.stdout)
    assert [c["quant"] for c in vision["candidates"]] == ["Q2_K", "Q4_K_M", "Q6_K", "Q8_0", "F16"]
    assert {c["projector"] for c in vision["candidates"]} == {"mmproj-fit-F16.gguf"}
    for a, b in zip(plain["candidates"], vision["candidates"], strict=True):
        if a["fits"] and b["fits"]:
            assert b["estimate_bytes"]["amd:0"] > a["estimate_bytes"]["amd:0"]
    assert vision["pick"] in ("Q4_K_M", "Q6_K") and vision["reference"] == f"org/vision-GGUF:{vision['pick']}"


def test_a_hub_that_ignores_range_is_read_from_the_stream_start(env: dict[str, str], hub: StandinHub) -> None:
    env = dict(env, FORGE_HF_ENDPOINT=hub.url)
    r = forge_pull(env, "org/mirror-GGUF", "--fit", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "pick: Q6_K, the largest that fits; would pull org/mirror-GGUF:Q6_K" in r.stdout
    assert downloaded(env) == []
    big = len(hub.repos["org/mirror-GGUF"].files["fit-F16.gguf"])
    deadline = time.monotonic() + 30  # the server notices the closed transfer on its next write
    while not any(name == "fit-F16.gguf" for name, _ in hub.sent) and time.monotonic() < deadline:
        time.sleep(0.05)
    [sent] = [n for name, n in hub.sent if name == "fit-F16.gguf"]
    assert sent < big // 2  # the transfer was closed once the header was read


@pytest.mark.parametrize(
    ("repo", "message"),
    [
        ("org/safetensors-only", "org/safetensors-only has no GGUF files"),
        ("org/nothing-GGUF", "no Hugging Face repository org/nothing-GGUF"),
    ],
)
def test_a_repo_without_ggufs_or_none_at_all(env: dict[str, str], repo: str, message: str) -> None:
    r = forge_pull(env, repo, "--fit")
    assert r.returncode != 0
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert downloaded(env) == []


def test_a_hub_that_is_down(env: dict[str, str]) -> None:
    import socket

    with socket.socket() as s:  # a port the OS gave and nothing listens on any more
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = forge_pull(dict(env, FORGE_HF_ENDPOINT=f"http://127.0.0.1:{port}"), "org/fit-GGUF", "--fit")
    assert r.returncode != 0
    assert f"error: cannot reach the hub at http://127.0.0.1:{port}: Connection refused" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert downloaded(env) == []


def test_nothing_fits(env: dict[str, str]) -> None:
    r = forge_pull(env, "org/fit-GGUF", "--fit", "--ctx", "4000000")
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no GGUF of org/fit-GGUF fits this machine's devices with ctx 4000000")
    assert "(the smallest, Q2_K: it needs" in last and "forge pull org/fit-GGUF:QUANT" in last
    assert downloaded(env) == []


def test_fit_refuses_a_named_quant_and_the_options_need_it(env: dict[str, str]) -> None:
    r = forge_pull(env, "org/fit-GGUF:Q4_K_M", "--fit")
    assert r.returncode != 0 and "--fit chooses the quant itself" in r.stderr
    r = forge_pull(env, "org/fit-GGUF:Q4_K_M", "--dry-run")
    assert r.returncode != 0 and "--ctx, --parallel and --dry-run go with --fit" in r.stderr
    assert downloaded(env) == []


# -- the header reads, in process ------------------------------------------------------------------


def test_a_real_header_read_in_growing_ranges_describes_the_file_exactly(
    tmp_path: Path, gemma_path: Path, smollm2_path: Path
) -> None:
    """gemma-3-270m's header is 6.5 MB (a 262,144-token vocabulary): from 64 KiB, each range twice
    the last until it is whole; the description is the one of the whole file."""
    standin = StandinHub(
        repos={
            "org/real-GGUF": StandinRepo(
                files={
                    "gemma-Q4_K_M.gguf": gemma_path.read_bytes(),
                    "smol-Q4_1.gguf": smollm2_path.read_bytes(),
                }
            )
        }
    )
    with running_hub(standin) as hub:
        settings = ForgeSettings().model_copy(
            update={"hf_cache_dir": tmp_path, "hf_offline": False, "hf_endpoint": hub.url, "hf_token": None}
        )
        repo = hub_quants("org/real-GGUF", settings, first=64 * 1024)
    for q, path in zip(repo.quants, (smollm2_path, gemma_path), strict=True):
        assert q.info is not None
        whole = inspect_gguf(path)
        assert q.info == replace(whole, path=Path(q.files[0]), split_files=(Path(q.files[0]),))
    ranges = [rng for p, rng in gguf_gets(hub) if p.endswith("gemma-Q4_K_M.gguf")]
    assert len(ranges) >= 5 and ranges[0] == "bytes=0-65535" and ranges[1] == "bytes=65536-131071"
    assert not list(tmp_path.rglob("*.gguf"))


def test_offline_fit_says_it_needs_the_hub(tmp_path: Path) -> None:
    settings = ForgeSettings().model_copy(update={"hf_cache_dir": tmp_path, "hf_offline": True})
    with pytest.raises(HubError, match="reads org/x's file headers from the hub, and offline mode is on"):
        hub_quants("org/x", settings)


def test_a_broken_quant_is_no_candidate(tmp_path: Path, quants: dict[str, bytes]) -> None:
    standin = StandinHub(
        repos={"org/b-GGUF": StandinRepo(files={"b-Q2_K.gguf": quants["Q2_K"], "b-Q8_0.gguf": b"not a gguf"})}
    )
    with running_hub(standin) as hub:
        settings = ForgeSettings().model_copy(
            update={"hf_cache_dir": tmp_path, "hf_offline": False, "hf_endpoint": hub.url, "hf_token": None}
        )
        repo = hub_quants("org/b-GGUF", settings)
    bad = next(q for q in repo.quants if q.label == "Q8_0")
    assert bad.info is None and bad.problem is not None and "not a GGUF model" in bad.problem
