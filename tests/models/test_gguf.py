"""GGUF inspection of real files, and of real files broken the ways downloads and users break them."""

from __future__ import annotations

import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

from rocmforge_supervisor._errors import InvalidModelFile, ModelNotFound
from rocmforge_supervisor.models import inspect_gguf
from rocmforge_supervisor.models._names import matches_quant, parse_split_name, quant_tag_of

from .conftest import copy_gguf
from .test_estimate_real import _stop

# -- the real embedded model ---------------------------------------------------------------------


def test_gemma_metadata(gemma_path: Path) -> None:
    info = inspect_gguf(gemma_path)
    assert info.architecture == "gemma3"
    assert info.file_type == "Q4_K_M"
    assert info.context_length == 32768
    assert info.block_count == 18
    assert info.head_count == 4 and info.head_count_kv_max == 1
    assert info.embedding_length == 640 and info.key_length == 256
    assert info.vocab_size == 262144
    assert info.parameter_count == 268_098_176
    assert info.file_size_bytes == gemma_path.stat().st_size == 253_113_024
    assert info.split_files == (gemma_path,)
    # Gemma 3: a 512-token window on five of every six layers (layers 5, 11, 17 attend fully).
    assert info.sliding_window == 512
    assert [il for il, swa in enumerate(info.swa_layers) if not swa] == [5, 11, 17]
    # The tensor table adds up to the file minus its header; the head is tied to the embedding.
    assert info.output_tied
    assert sum(info.layer_bytes) + info.input_bytes + info.output_bytes == info.tensor_bytes
    assert 0 < gemma_path.stat().st_size - info.tensor_bytes < 8 * 1024 * 1024


def test_gemma_json_has_the_issue_keys(gemma_path: Path) -> None:
    data = inspect_gguf(gemma_path).to_json()
    for key in (
        "architecture",
        "parameter_count",
        "file_type",
        "context_length",
        "block_count",
        "head_count",
        "head_count_kv",
        "embedding_length",
        "vocab_size",
        "file_size_bytes",
        "split_files",
        "has_chat_template",
    ):
        assert key in data, key
    assert data["head_count_kv"] == 1
    assert data["split_files"] == [str(gemma_path)]


def test_large_vocabulary_is_read_quickly(gemma_path: Path) -> None:
    """The stock GGUFReader takes ~20 s on gemma's 262k-token vocabulary; ours must not."""
    t0 = time.monotonic()
    inspect_gguf(gemma_path)
    assert time.monotonic() - t0 < 8.0


def test_tiny_model_has_chat_template(tiny_gguf: Path) -> None:
    info = inspect_gguf(tiny_gguf)
    assert info.architecture == "llama"
    assert info.has_chat_template
    assert info.file_type == "F32"
    assert info.head_count_kv == (2, 2)
    assert not info.output_tied
    assert info.sliding_window is None and not any(info.swa_layers)


# -- broken copies -------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


def test_truncated_tensor_data(tiny_gguf: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    data = tiny_gguf.read_bytes()
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(InvalidModelFile) as err:
        inspect_gguf(cut)
    msg = _one_line(err.value)
    assert "truncated" in msg and f"{len(data) - 1000:,}" in msg and "download" in msg


def test_truncated_real_model(gemma_path: Path, tmp_path: Path) -> None:
    cut = tmp_path / "gemma-cut.gguf"
    with gemma_path.open("rb") as src, cut.open("wb") as dst:
        dst.write(src.read(100_000_000))
    with pytest.raises(InvalidModelFile, match="truncated"):
        inspect_gguf(cut)


def test_truncated_inside_header(tiny_gguf: Path, tmp_path: Path) -> None:
    cut = tmp_path / "header.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:300])
    with pytest.raises(InvalidModelFile) as err:
        inspect_gguf(cut)
    assert "truncated or corrupt" in _one_line(err.value)


def test_bad_magic(tiny_gguf: Path, tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04" + tiny_gguf.read_bytes()[4:])
    with pytest.raises(InvalidModelFile) as err:
        inspect_gguf(bad)
    msg = _one_line(err.value)
    assert "not a GGUF model" in msg and "b'PK\\x03\\x04'" in msg and "convert_hf_to_gguf" in msg


@pytest.mark.parametrize("version", [1, 4, 99])
def test_unsupported_version(tiny_gguf: Path, tmp_path: Path, version: int) -> None:
    bad = tmp_path / f"v{version}.gguf"
    data = bytearray(tiny_gguf.read_bytes())
    data[4:8] = struct.pack("<I", version)
    bad.write_bytes(bytes(data))
    with pytest.raises(InvalidModelFile) as err:
        inspect_gguf(bad)
    assert f"GGUF version {version}" in _one_line(err.value)


def test_empty_and_tiny_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(InvalidModelFile, match="only 0 bytes"):
        inspect_gguf(empty)
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF")
    with pytest.raises(InvalidModelFile, match="only 4 bytes"):
        inspect_gguf(short)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound):
        inspect_gguf(tmp_path / "nope.gguf")


def test_llama_server_agrees_the_broken_files_are_broken(
    tiny_gguf: Path, tmp_path: Path, llama_server_bin: Path
) -> None:
    """What we refuse, the real loader refuses too (so refusing early loses nothing)."""
    cut = tmp_path / "cut.gguf"
    data = tiny_gguf.read_bytes()
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(InvalidModelFile):
        inspect_gguf(cut)
    r = subprocess.run(
        [str(llama_server_bin), "-m", str(cut), "--port", "0", "--host", "127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert "failed to load model" in r.stderr


def test_architecture_this_llama_server_lacks(
    tiny_gguf: Path, tmp_path: Path, llama_server_bin: Path
) -> None:
    """A well-formed GGUF of an unknown architecture passes inspection; the child's load error
    names it (the line the process layer classifies as ``unsupported``)."""
    [odd] = copy_gguf(tiny_gguf, tmp_path / "odd.gguf", arch="xyzzy")
    assert inspect_gguf(odd).architecture == "xyzzy"
    r = subprocess.run(
        [str(llama_server_bin), "-m", str(odd), "--port", "0", "--host", "127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert "error loading model: unknown model architecture: 'xyzzy'" in r.stderr


# -- split models --------------------------------------------------------------------------------


def test_split_model_from_first_part(split_tiny: list[Path], tiny_gguf: Path) -> None:
    whole = inspect_gguf(tiny_gguf)
    info = inspect_gguf(split_tiny[0])
    assert info.is_split and info.split_files == tuple(split_tiny)
    assert info.path == split_tiny[0]
    assert info.file_size_bytes == sum(p.stat().st_size for p in split_tiny)
    # The parts hold the same model: same tensors, same metadata.
    assert info.tensor_bytes == whole.tensor_bytes
    assert info.tensor_count == whole.tensor_count
    assert info.layer_bytes == whole.layer_bytes
    assert info.vocab_size == whole.vocab_size and info.has_chat_template
    assert info.to_json()["split_files"] == [str(p) for p in split_tiny]


def test_split_model_from_a_later_part(split_tiny: list[Path]) -> None:
    info = inspect_gguf(split_tiny[2])
    assert info.path == split_tiny[0] and len(info.split_files) == 3


def test_split_model_missing_part(split_tiny: list[Path], tmp_path: Path) -> None:
    for p in split_tiny[:2]:
        shutil.copy(p, tmp_path / p.name)
    with pytest.raises(ModelNotFound) as err:
        inspect_gguf(tmp_path / split_tiny[0].name)
    msg = _one_line(err.value)
    assert "missing 1 of its 3 parts" in msg and split_tiny[2].name in msg


def test_split_part_renamed(split_tiny: list[Path], tmp_path: Path) -> None:
    renamed = tmp_path / "first.gguf"
    shutil.copy(split_tiny[0], renamed)
    with pytest.raises(InvalidModelFile, match="3-part split model but is not named like one"):
        inspect_gguf(renamed)


def test_llama_server_loads_the_split_parts(split_tiny: list[Path], llama_server_bin: Path) -> None:
    """Our reading of split names is llama.cpp's: it finds parts 2 and 3 from the first."""
    cmd = [str(llama_server_bin), "-m", str(split_tiny[0]), "--port", "0", "--host", "127.0.0.1"]
    proc = subprocess.Popen(
        [*cmd, "-c", "256", "-lv", "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "listening on" in line or "exiting" in line:
                break
        assert any("listening on" in line for line in seen), "".join(seen[-20:])
        assert any("additional 2 GGUFs metadata loaded" in line for line in seen)
    finally:
        _stop(proc)
        if proc.stderr is not None:
            proc.stderr.close()


# -- names ---------------------------------------------------------------------------------------


def test_split_names() -> None:
    s = parse_split_name("Llama-3.1-70B-Q4_K_M-00002-of-00005.gguf")
    assert s is not None and (s.prefix, s.no, s.count) == ("Llama-3.1-70B-Q4_K_M", 2, 5)
    assert s.part(1) == "Llama-3.1-70B-Q4_K_M-00001-of-00005.gguf"
    assert len(s.all_parts()) == 5
    assert parse_split_name("model-Q4_K_M.gguf") is None
    assert parse_split_name("model-00006-of-00005.gguf") is None
    assert parse_split_name("model-00000-of-00005.gguf") is None


@pytest.mark.parametrize(
    ("path", "tag", "expected"),
    [
        ("gemma-3-270m-it-Q4_K_M.gguf", "Q4_K_M", True),
        ("gemma-3-270m-it-q4_k_m.gguf", "Q4_K_M", True),
        ("model.Q8_0.gguf", "q8_0", True),
        ("model-Q4_K_M-00001-of-00002.gguf", "Q4_K_M", True),
        ("Q4_K_M/model-00001-of-00002.gguf", "Q4_K_M", True),
        ("UD-Q4_K_XL/model-UD-Q4_K_XL-00001-of-00002.gguf", "UD-Q4_K_XL", True),
        ("model-UD-Q4_K_XL.gguf", "Q4_K_XL", True),
        ("model-Q4_K_M.gguf", "Q4_K", False),
        ("model-Q4_K_S.gguf", "Q4_K_M", False),
        ("model-IQ4_XS.gguf", "Q4_XS", False),
        ("model-BF16.gguf", "bf16", True),
    ],
)
def test_quant_matching(path: str, tag: str, expected: bool) -> None:
    assert matches_quant(path, tag) is expected


def test_quant_tag_of() -> None:
    assert quant_tag_of("gemma-3-270m-it-q4_k_m.gguf") == "Q4_K_M"
    assert quant_tag_of("model-UD-Q4_K_XL-00001-of-00003.gguf") == "UD-Q4_K_XL"
    assert quant_tag_of("model.IQ4_XS.gguf") == "IQ4_XS"
    assert quant_tag_of("model-BF16.gguf") == "BF16"
    assert quant_tag_of("model.gguf") is None
