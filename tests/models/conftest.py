"""Fixtures for the models tests: real GGUF files (the tiny model, split into parts by the gguf
package's own writer), and model descriptions shaped like real ones for placement."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from rocmforge_supervisor.models._gguf import GGUFInfo

GIB = 1024**3
MIB = 1024**2


def copy_gguf(src: Path, dst: Path, *, max_tensors: int = 0, arch: str | None = None) -> list[Path]:
    """Rewrite a GGUF with :class:`gguf.GGUFWriter`: split into ``dst``-0000k-of-0000n.gguf parts
    (the layout gguf-split and hub uploads use) and/or under another architecture name."""
    reader = gguf.GGUFReader(src)
    old_arch = reader.fields["general.architecture"].contents()
    new_arch = arch or old_arch
    writer = gguf.GGUFWriter(dst, new_arch, split_max_tensors=max_tensors)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        key = new_arch + name[len(old_arch) :] if name.startswith(old_arch + ".") else name
        writer.add_key_value(key, f.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=None, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if max_tensors:
        return sorted(dst.parent.glob(f"{dst.stem}-*-of-*.gguf"))
    return [dst]


@pytest.fixture(scope="session")
def split_tiny(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The tiny model in three parts (7 tensors each)."""
    out = tmp_path_factory.mktemp("split") / "tiny-split.gguf"
    parts = copy_gguf(tiny_gguf, out, max_tensors=7)
    assert len(parts) == 3
    return parts


def model_like(
    name: str,
    *,
    n_layer: int,
    layer_bytes: int,
    embd_bytes: int,
    n_embd: int,
    n_head: int,
    n_head_kv: int,
    head_dim: int = 128,
    n_ff: int | None = None,
    vocab: int = 128256,
    ctx: int = 131072,
    output_bytes: int | None = None,
    tied: bool = False,
    file_type: str = "Q4_K_M",
) -> GGUFInfo:
    """A model description with a real model's shape (sizes as its GGUF's tensor table gives them).

    Placement is a pure function of these numbers, so the big models of the placement tests
    (8B, 70B, 405B) need only their shapes here, not their files.
    """
    output = 0 if tied else (embd_bytes if output_bytes is None else output_bytes)
    return GGUFInfo(
        path=Path(f"/models/{name}.gguf"),
        architecture="llama",
        name=name,
        size_label=None,
        parameter_count=0,
        file_type=file_type,
        file_type_id=15,
        gguf_version=3,
        context_length=ctx,
        block_count=n_layer,
        head_count=n_head,
        head_count_kv=(n_head_kv,) * n_layer,
        embedding_length=n_embd,
        feed_forward_length=n_ff or 4 * n_embd,
        key_length=head_dim,
        value_length=head_dim,
        vocab_size=vocab,
        sliding_window=None,
        swa_layers=(False,) * n_layer,
        has_chat_template=True,
        split_files=(Path(f"/models/{name}.gguf"),),
        file_size_bytes=n_layer * layer_bytes + embd_bytes + output,
        tensor_count=n_layer * 9 + 3,
        tensor_bytes=n_layer * layer_bytes + embd_bytes + output,
        layer_bytes=(layer_bytes,) * n_layer,
        input_bytes=embd_bytes,
        output_bytes=output,
        output_tied=tied,
        embedding_bytes=embd_bytes,
        layer_repack_bytes=(0,) * n_layer,
    )


# Llama 3.1 shapes at Q4_K_M (embedding Q4_K, output Q6_K, blocks as in their GGUFs' tensor tables).
LLAMA_8B = model_like(
    "llama-3.1-8b",
    n_layer=32,
    layer_bytes=124 * MIB,
    embd_bytes=282 * MIB,
    output_bytes=411 * MIB,
    n_embd=4096,
    n_head=32,
    n_head_kv=8,
    n_ff=14336,
)
LLAMA_70B = model_like(
    "llama-3.1-70b",
    n_layer=80,
    layer_bytes=490 * MIB,
    embd_bytes=564 * MIB,
    output_bytes=822 * MIB,
    n_embd=8192,
    n_head=64,
    n_head_kv=8,
    n_ff=28672,
)
LLAMA_405B = model_like(
    "llama-3.1-405b",
    n_layer=126,
    layer_bytes=1823 * MIB,
    embd_bytes=1128 * MIB,
    output_bytes=1644 * MIB,
    n_embd=16384,
    n_head=128,
    n_head_kv=8,
    n_ff=53248,
)
