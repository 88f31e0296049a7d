"""``forge pull`` fetching a vision model's projector with it, and ``mmproj`` references resolved
from the hub, against the local stand-in of the Hub's file API (no network here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocmforge_supervisor._errors import InvalidModelFile, ModelNotFound
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.models import pull_with_projector, resolve_model_path, resolve_projector_path
from rocmforge_supervisor.models._hub import hub_projector
from tests.support.tiny_clip import write_tiny_clip

from .hub_standin import StandinHub, StandinRepo, running_hub


@pytest.fixture(scope="module")
def clip_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_tiny_clip(tmp_path_factory.mktemp("clip") / "mmproj.gguf").read_bytes()


@pytest.fixture
def hub(tiny_gguf: Path, clip_bytes: bytes) -> Iterator[StandinHub]:
    tiny = tiny_gguf.read_bytes()
    standin = StandinHub(
        repos={
            "org/vision-GGUF": StandinRepo(
                files={
                    "vis-Q8_0.gguf": tiny,
                    "vis-F32.gguf": tiny,
                    "mmproj-vis-f16.gguf": clip_bytes,
                    "mmproj-vis-Q8_0.gguf": clip_bytes,
                    "README.md": b"# vision\n",
                }
            ),
            "org/text-GGUF": StandinRepo(files={"text-Q8_0.gguf": tiny}),
            "org/broken-GGUF": StandinRepo(files={"b-Q8_0.gguf": tiny, "mmproj-b-f16.gguf": b"not a gguf"}),
        }
    )
    with running_hub(standin) as running:
        yield running


def online(cache: Path, hub: StandinHub) -> ForgeSettings:
    return ForgeSettings().model_copy(
        update={"hf_cache_dir": cache, "hf_offline": False, "hf_endpoint": hub.url, "hf_token": None}
    )


def offline(cache: Path) -> ForgeSettings:
    return ForgeSettings().model_copy(update={"hf_cache_dir": cache, "hf_offline": True, "hf_token": None})


def test_pull_fetches_the_projector_that_matches_the_quant(
    tmp_path: Path, hub: StandinHub, clip_bytes: bytes
) -> None:
    pulled = pull_with_projector("org/vision-GGUF:Q8_0", online(tmp_path, hub), progress=False)
    assert [p.name for p in pulled.paths] == ["vis-Q8_0.gguf"]
    assert pulled.projector is not None and pulled.projector.name == "mmproj-vis-Q8_0.gguf"
    assert pulled.projector.read_bytes() == clip_bytes
    assert set(pulled.projector_candidates) == {"mmproj-vis-f16.gguf", "mmproj-vis-Q8_0.gguf"}
    # Then `mmproj = "auto"` for that model works offline, from the cache alone.
    settings = offline(tmp_path)
    model = resolve_model_path("hf:org/vision-GGUF:Q8_0", settings)
    assert resolve_projector_path("auto", "hf:org/vision-GGUF:Q8_0", model, settings) == pulled.projector


def test_pull_takes_f16_when_no_projector_carries_the_quant(tmp_path: Path, hub: StandinHub) -> None:
    pulled = pull_with_projector("org/vision-GGUF:F32", online(tmp_path, hub), progress=False)
    assert pulled.projector is not None and pulled.projector.name == "mmproj-vis-f16.gguf"


def test_pull_of_a_text_model_fetches_no_projector(tmp_path: Path, hub: StandinHub) -> None:
    pulled = pull_with_projector("org/text-GGUF:Q8_0", online(tmp_path, hub), progress=False)
    assert pulled.projector is None and pulled.projector_candidates == ()
    settings = online(tmp_path, hub)
    with pytest.raises(ModelNotFound, match=r"org/text-GGUF has no projector \(no mmproj\*\.gguf file\)"):
        resolve_projector_path("auto", "hf:org/text-GGUF:Q8_0", pulled.paths[0], settings)


def test_a_broken_projector_is_named_at_pull(tmp_path: Path, hub: StandinHub) -> None:
    with pytest.raises(InvalidModelFile, match=r"mmproj-b-f16\.gguf is not a GGUF model"):
        pull_with_projector("org/broken-GGUF:Q8_0", online(tmp_path, hub), progress=False)


def test_an_mmproj_hub_file_reference_downloads_that_file(tmp_path: Path, hub: StandinHub) -> None:
    settings = online(tmp_path, hub)
    path = hub_projector("org/vision-GGUF:mmproj-vis-f16.gguf", settings)
    assert path.name == "mmproj-vis-f16.gguf"
    assert resolve_projector_path("hf:org/vision-GGUF/mmproj-vis-f16.gguf", "m", path, settings) == path
    with pytest.raises(ModelNotFound, match=r"org/vision-GGUF has no file mmproj-nope\.gguf"):
        hub_projector("org/vision-GGUF:mmproj-nope.gguf", settings)


def test_forge_pull_prints_the_projector_and_says_which_it_took(tmp_path: Path, hub: StandinHub) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "FORGE_HF"))}
    env.update(
        HF_HUB_CACHE=str(tmp_path), HF_ENDPOINT=hub.url, COLUMNS="300", HF_HUB_DISABLE_PROGRESS_BARS="1"
    )
    cmd = [sys.executable, "-m", "rocmforge_supervisor.cli", "pull", "org/vision-GGUF:Q8_0"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].endswith("vis-Q8_0.gguf") and lines[1].endswith("mmproj-vis-Q8_0.gguf")
    assert "projector: took mmproj-vis-Q8_0.gguf of 2 in the repo (others: mmproj-vis-f16.gguf)" in r.stderr
    assert 'mmproj = "auto"' in r.stderr
    j = subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert j.returncode == 0, j.stderr
    out = json.loads(j.stdout)
    assert out["projector"].endswith("mmproj-vis-Q8_0.gguf") and len(out["projector_candidates"]) == 2


def test_auto_resolves_from_the_cache_without_asking_the_hub(tmp_path: Path, hub: StandinHub) -> None:
    """A model restarting must not depend on huggingface.co: once pulled, no request at all."""
    settings = online(tmp_path, hub)
    pulled = pull_with_projector("org/vision-GGUF:Q8_0", settings, progress=False)
    before = len(hub.requests)
    model = resolve_model_path("hf:org/vision-GGUF:Q8_0", settings)
    assert resolve_projector_path("auto", "hf:org/vision-GGUF:Q8_0", model, settings) == pulled.projector
    assert len(hub.requests) == before
