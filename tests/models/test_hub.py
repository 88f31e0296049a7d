"""Hugging Face references, offline against a hub cache laid out on disk, and online against a
local stand-in of the Hub's file API (no network here)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocmforge_supervisor._errors import HubError, InvalidModelFile, ModelNotFound, UsageError
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.models import inspect_gguf, parse_hf_reference, pull, resolve_hf_reference
from rocmforge_supervisor.models._catalog import resolve_model_path
from rocmforge_supervisor.models._hub import HubRef, select_gguf_files

from .hub_standin import StandinHub, StandinRepo, running_hub

COMMIT = "c0ffee" + "0" * 34


def write_cache(cache: Path, repo_id: str, files: dict[str, bytes], *, commit: str = COMMIT) -> Path:
    """Lay files out as huggingface-hub's cache does: blobs by hash, snapshot symlinks, refs/main."""
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    snapshot = storage / "snapshots" / commit
    for rel, data in files.items():
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def offline(cache: Path) -> ForgeSettings:
    return ForgeSettings().model_copy(update={"hf_cache_dir": cache, "hf_offline": True, "hf_token": None})


@pytest.fixture
def tiny_bytes(tiny_gguf: Path) -> bytes:
    return tiny_gguf.read_bytes()


# -- references ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("unsloth/gemma-3-270m-it-GGUF", HubRef("unsloth/gemma-3-270m-it-GGUF")),
        ("unsloth/gemma-3-270m-it-GGUF:Q4_K_M", HubRef("unsloth/gemma-3-270m-it-GGUF", quant="Q4_K_M")),
        ("hf:org/repo:q8_0", HubRef("org/repo", quant="q8_0")),
        ("hf.co/org/repo:UD-Q4_K_XL", HubRef("org/repo", quant="UD-Q4_K_XL")),
        ("https://huggingface.co/org/repo", HubRef("org/repo")),
        ("org/repo/model-Q4_K_M.gguf", HubRef("org/repo", filename="model-Q4_K_M.gguf")),
        (
            "org/repo/Q4_K_M/m-00001-of-00002.gguf",
            HubRef("org/repo", filename="Q4_K_M/m-00001-of-00002.gguf"),
        ),
        ("org/repo@v1.0:Q4_K_M", HubRef("org/repo", revision="v1.0", quant="Q4_K_M")),
    ],
)
def test_parse_references(text: str, expected: HubRef) -> None:
    assert parse_hf_reference(text) == expected


@pytest.mark.parametrize(
    "text", ["repo-only", "org/repo/model.safetensors", "org/repo:", "/abs/path.gguf", "a/b/c"]
)
def test_bad_references(text: str) -> None:
    with pytest.raises(UsageError, match="not a Hugging Face model reference"):
        parse_hf_reference(text)


# -- choosing files (pure) -------------------------------------------------------------------------

LISTING = [
    ".gitattributes",
    "README.md",
    "gemma-3-270m-it-Q4_K_M.gguf",
    "gemma-3-270m-it-UD-Q4_K_M.gguf",
    "gemma-3-270m-it-Q8_0.gguf",
    "gemma-3-270m-it-BF16.gguf",
    "mmproj-F16.gguf",
    "Q6_K/gemma-3-270m-it-Q6_K-00001-of-00002.gguf",
    "Q6_K/gemma-3-270m-it-Q6_K-00002-of-00002.gguf",
    "gemma-3-270m-it-IQ4_XS-00001-of-00003.gguf",
    "gemma-3-270m-it-IQ4_XS-00002-of-00003.gguf",
    "gemma-3-270m-it-IQ4_XS-00003-of-00003.gguf",
]


@pytest.mark.parametrize(
    ("ref", "files"),
    [
        ("org/r:Q4_K_M", ["gemma-3-270m-it-Q4_K_M.gguf"]),  # not the longer UD- name
        ("org/r:q4_k_m", ["gemma-3-270m-it-Q4_K_M.gguf"]),
        ("org/r:UD-Q4_K_M", ["gemma-3-270m-it-UD-Q4_K_M.gguf"]),
        ("org/r:bf16", ["gemma-3-270m-it-BF16.gguf"]),
        (
            "org/r:Q6_K",
            [
                "Q6_K/gemma-3-270m-it-Q6_K-00001-of-00002.gguf",
                "Q6_K/gemma-3-270m-it-Q6_K-00002-of-00002.gguf",
            ],
        ),
        ("org/r:IQ4_XS", [f"gemma-3-270m-it-IQ4_XS-0000{i}-of-00003.gguf" for i in (1, 2, 3)]),
        ("org/r", ["gemma-3-270m-it-Q4_K_M.gguf"]),  # no tag: llama.cpp's default, Q4_K_M
        ("org/r/gemma-3-270m-it-Q8_0.gguf", ["gemma-3-270m-it-Q8_0.gguf"]),
        (
            "org/r/gemma-3-270m-it-IQ4_XS-00001-of-00003.gguf",
            [f"gemma-3-270m-it-IQ4_XS-0000{i}-of-00003.gguf" for i in (1, 2, 3)],
        ),
    ],
)
def test_quant_resolution(ref: str, files: list[str]) -> None:
    assert select_gguf_files(LISTING, parse_hf_reference(ref)) == files


def test_unknown_quant_lists_the_available_ones() -> None:
    with pytest.raises(ModelNotFound) as err:
        select_gguf_files(LISTING, parse_hf_reference("org/r:Q3_K_S"))
    assert "org/r has no Q3_K_S GGUF" in str(err.value)
    assert "available: BF16, IQ4_XS, Q4_K_M, Q6_K, Q8_0, UD-Q4_K_M" in str(err.value)
    assert "MMPROJ" not in str(err.value).upper()


def test_repo_without_gguf() -> None:
    with pytest.raises(ModelNotFound, match="has no GGUF files") as err:
        select_gguf_files(["config.json", "model.safetensors"], parse_hf_reference("org/r:Q4_K_M"))
    assert "convert_hf_to_gguf" in str(err.value)


def test_single_model_repo_needs_no_tag_and_a_missing_file_is_named() -> None:
    assert select_gguf_files(["m-F16.gguf", "x.md"], parse_hf_reference("org/r")) == ["m-F16.gguf"]
    with pytest.raises(ModelNotFound, match="none is Q4_K_M"):
        select_gguf_files(["a-Q8_0.gguf", "a-F16.gguf"], parse_hf_reference("org/r"))
    with pytest.raises(ModelNotFound, match=r"has no file nope\.gguf"):
        select_gguf_files(LISTING, parse_hf_reference("org/r/nope.gguf"))


def test_ambiguous_tag() -> None:
    with pytest.raises(ModelNotFound, match="ambiguous"):
        select_gguf_files(["a/m-Q4_0.gguf", "b/m-Q4_0.gguf"], parse_hf_reference("org/r:Q4_0"))


# -- offline: the hub cache on disk ---------------------------------------------------------------


def test_offline_resolves_a_quant_from_the_cache(tmp_path: Path, tiny_bytes: bytes) -> None:
    snap = write_cache(
        tmp_path, "org/tiny-GGUF", {"tiny-Q8_0.gguf": b"GGUF" + b"\0" * 20, "tiny-F32.gguf": tiny_bytes}
    )
    settings = offline(tmp_path)
    path = resolve_hf_reference("org/tiny-GGUF:F32", settings)
    assert path == snap / "tiny-F32.gguf"
    assert inspect_gguf(path).architecture == "llama"
    # the same through the catalog, as `forge load hf:…` and config files reach it
    assert resolve_model_path("hf:org/tiny-GGUF:f32", settings) == path
    assert pull("org/tiny-GGUF:F32", settings) == [path]


def test_offline_split_model(tmp_path: Path, split_tiny: list[Path]) -> None:
    files = {f"F32/{p.name}": p.read_bytes() for p in split_tiny}
    snap = write_cache(tmp_path, "org/split-GGUF", files)
    paths = pull("org/split-GGUF:F32", offline(tmp_path))
    assert paths == [snap / "F32" / p.name for p in split_tiny]
    info = inspect_gguf(paths[0])
    assert info.is_split and len(info.split_files) == 3


def test_offline_missing_split_part(tmp_path: Path, split_tiny: list[Path]) -> None:
    write_cache(tmp_path, "org/split-GGUF", {f"F32/{p.name}": p.read_bytes() for p in split_tiny[:2]})
    with pytest.raises(HubError) as err:
        resolve_hf_reference("org/split-GGUF:F32", offline(tmp_path))
    msg = str(err.value)
    assert (
        "part F32/tiny-split-00003-of-00003.gguf of the split model is not in the Hugging Face cache" in msg
    )
    assert "forge pull" in msg and "\n" not in msg


def test_offline_missing_quant(tmp_path: Path, tiny_bytes: bytes) -> None:
    write_cache(tmp_path, "org/tiny-GGUF", {"tiny-F32.gguf": tiny_bytes})
    with pytest.raises(HubError) as err:
        resolve_hf_reference("org/tiny-GGUF:Q4_K_M", offline(tmp_path))
    msg = str(err.value)
    assert (
        f"org/tiny-GGUF:Q4_K_M is not in the Hugging Face cache ({tmp_path}), and offline mode is on" in msg
    )
    assert "forge pull org/tiny-GGUF:Q4_K_M" in msg and "cached from org/tiny-GGUF: F32" in msg


def test_offline_missing_file_and_repo(tmp_path: Path, tiny_bytes: bytes) -> None:
    write_cache(tmp_path, "org/tiny-GGUF", {"tiny-F32.gguf": tiny_bytes})
    with pytest.raises(HubError, match=r"other\.gguf is not in the Hugging Face cache"):
        pull("org/tiny-GGUF/other.gguf", offline(tmp_path))
    with pytest.raises(
        HubError, match=r"org/absent:Q4_K_M is not in the Hugging Face cache .* offline mode is on"
    ):
        pull("org/absent:Q4_K_M", offline(tmp_path))


def test_offline_broken_file_in_cache(tmp_path: Path, tiny_bytes: bytes) -> None:
    write_cache(tmp_path, "org/tiny-GGUF", {"tiny-F32.gguf": tiny_bytes[: len(tiny_bytes) // 2]})
    with pytest.raises(InvalidModelFile, match="truncated"):
        resolve_hf_reference("org/tiny-GGUF:F32", offline(tmp_path))


def _forge(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rocmforge_supervisor.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_forge_pull_honours_hf_hub_offline(tmp_path: Path, tiny_bytes: bytes) -> None:
    """The CLI with huggingface-hub's own variables: HF_HUB_OFFLINE and HF_HUB_CACHE."""
    snap = write_cache(tmp_path, "org/tiny-GGUF", {"tiny-F32.gguf": tiny_bytes})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "FORGE_HF"))}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path), COLUMNS="300")
    ok = _forge(["pull", "org/tiny-GGUF:F32"], env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == str(snap / "tiny-F32.gguf")
    bad = _forge(["pull", "hf:org/tiny-GGUF:Q4_K_M"], env)
    assert bad.returncode == 1
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        "error: org/tiny-GGUF:Q4_K_M is not in the Hugging Face cache"
    )


# -- online, against the stand-in ------------------------------------------------------------------


@pytest.fixture
def hub(tiny_bytes: bytes, split_tiny: list[Path]) -> Iterator[StandinHub]:
    standin = StandinHub(
        repos={
            "org/tiny-GGUF": StandinRepo(
                files={"README.md": b"# tiny\n", "tiny-F32.gguf": tiny_bytes, "mmproj-tiny-F16.gguf": b"x"},
                cut_once={"tiny-F32.gguf"},
            ),
            "org/split-GGUF": StandinRepo(files={f"F32/{p.name}": p.read_bytes() for p in split_tiny}),
            "org/gated-GGUF": StandinRepo(files={"g-Q4_K_M.gguf": tiny_bytes}, gated=True),
            "org/safetensors-only": StandinRepo(files={"model.safetensors": b"{}", "config.json": b"{}"}),
        }
    )
    with running_hub(standin) as running:
        yield running


def online(cache: Path, hub: StandinHub, token: str | None = None) -> ForgeSettings:
    return ForgeSettings().model_copy(
        update={"hf_cache_dir": cache, "hf_offline": False, "hf_endpoint": hub.url, "hf_token": token}
    )


def test_pull_survives_a_dropped_connection(tmp_path: Path, hub: StandinHub, tiny_bytes: bytes) -> None:
    settings = online(tmp_path, hub)
    [path] = pull("org/tiny-GGUF:F32", settings, progress=False)
    assert path.name == "tiny-F32.gguf" and path.read_bytes() == tiny_bytes
    # the first transfer was cut halfway; huggingface-hub tried again and completed it
    gets = [p for m, p, _ in hub.requests if m == "GET" and p.endswith("tiny-F32.gguf")]
    assert len(gets) == 2
    assert not list(tmp_path.rglob("*.incomplete"))
    # cached now: resolving makes no request at all, and works offline
    before = len(hub.requests)
    assert resolve_hf_reference("org/tiny-GGUF:F32", settings) == path
    assert len(hub.requests) == before
    assert resolve_hf_reference("org/tiny-GGUF:F32", offline(tmp_path)) == path


def test_failed_download_leaves_nothing_under_the_final_name(tmp_path: Path, hub: StandinHub) -> None:
    hub.repos["org/tiny-GGUF"].cut_always.add("tiny-F32.gguf")
    with pytest.raises(HubError) as err:
        pull("org/tiny-GGUF:F32", online(tmp_path, hub), progress=False)
    assert f"cannot download org/tiny-GGUF:F32 from {hub.url}" in str(err.value)
    assert not list(tmp_path.rglob("*.gguf"))  # no snapshot entry under the model's name
    blobs = [p for p in tmp_path.rglob("blobs/*") if not p.name.endswith(".incomplete")]
    assert blobs == []  # and no finished-looking blob either
    with pytest.raises(HubError, match="not in the Hugging Face cache"):
        resolve_hf_reference("org/tiny-GGUF:F32", offline(tmp_path))


def test_pull_split_model(tmp_path: Path, hub: StandinHub, split_tiny: list[Path]) -> None:
    paths = pull("org/split-GGUF:F32", online(tmp_path, hub), progress=False)
    assert [p.name for p in paths] == [p.name for p in split_tiny]
    assert len({p.parent for p in paths}) == 1
    assert inspect_gguf(paths[0]).split_files == tuple(paths)


def test_resolve_downloads_when_not_cached(tmp_path: Path, hub: StandinHub) -> None:
    path = resolve_hf_reference("org/tiny-GGUF", online(tmp_path, hub))  # one model, mmproj ignored
    assert path.name == "tiny-F32.gguf"


def test_gated_repo_without_token(tmp_path: Path, hub: StandinHub) -> None:
    with pytest.raises(HubError) as err:
        pull("org/gated-GGUF:Q4_K_M", online(tmp_path, hub), progress=False)
    msg = str(err.value)
    assert "org/gated-GGUF is a gated repository" in msg and "HF_TOKEN" in msg and "\n" not in msg
    assert not list(tmp_path.rglob("*.gguf"))


def test_unknown_repo_and_repo_without_gguf(tmp_path: Path, hub: StandinHub) -> None:
    with pytest.raises(ModelNotFound, match="no Hugging Face repository org/nothing"):
        pull("org/nothing:Q4_K_M", online(tmp_path, hub), progress=False)
    with pytest.raises(ModelNotFound, match="org/safetensors-only has no GGUF files"):
        pull("org/safetensors-only", online(tmp_path, hub), progress=False)
    with pytest.raises(ModelNotFound, match="has no Q4_K_M GGUF"):
        pull("org/tiny-GGUF:Q4_K_M", online(tmp_path, hub), progress=False)
    assert not list(tmp_path.rglob("*.gguf"))


def test_unreachable_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface-hub retries a refused connection with backoff (1 + 2 + 4 + 8 + 8 s) before the
    one-line error: the waits are recorded here instead of slept."""
    import huggingface_hub.utils._http as hf_http

    waits: list[float] = []
    monkeypatch.setattr(hf_http.time, "sleep", waits.append)
    settings = ForgeSettings().model_copy(
        update={"hf_cache_dir": tmp_path, "hf_offline": False, "hf_endpoint": "http://127.0.0.1:9"}
    )
    with pytest.raises(HubError, match=r"cannot download org/x:Q4_K_M from http://127\.0\.0\.1:9"):
        pull("org/x:Q4_K_M", settings, progress=False)
    assert waits, "the hub's retries were not the path taken"


def test_offline_with_a_full_listing_knows_a_quant_does_not_exist(tmp_path: Path, hub: StandinHub) -> None:
    """After a snapshot_download the cache holds the repo's whole listing: offline answers are exact."""
    from huggingface_hub import snapshot_download

    snapshot_download("org/tiny-GGUF", allow_patterns=["*F32*"], cache_dir=tmp_path, endpoint=hub.url)
    settings = offline(tmp_path)
    assert resolve_hf_reference("org/tiny-GGUF:F32", settings).name == "tiny-F32.gguf"
    with pytest.raises(ModelNotFound, match="org/tiny-GGUF has no Q4_K_M GGUF"):
        resolve_hf_reference("org/tiny-GGUF:Q4_K_M", settings)


def test_hub_warnings_come_out_once_where_the_application_logs() -> None:
    """huggingface-hub's retry warnings went to its own handler and, propagated, to forge serve's:
    each line twice. After any hub call, only the application's handler prints them."""
    code = (
        "import logging, sys\n"
        "logging.basicConfig(stream=sys.stderr, format='forge: %(message)s')\n"
        "import huggingface_hub.utils.logging\n"
        "from rocmforge_supervisor.models._hub import _hub_logs_once\n"
        "_hub_logs_once()\n"
        "logging.getLogger('huggingface_hub.utils._http').warning('Retrying in 8s [Retry 4/5].')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("Retrying in 8s") == 1 and "forge: Retrying" in done.stderr, done.stderr
