"""Write a LoRA adapter GGUF for a real base model, with the ``gguf`` package (no network).

The layout is what the pinned llama.cpp reads (``src/llama-adapter.cpp``,
``llama_adapter_lora_init_impl``): ``general.type = "adapter"``, ``adapter.type = "lora"``,
``adapter.lora.alpha``, ``general.architecture`` the base's, and per adapted weight ``W``
(ggml shape ``[n_in, n_out]``) a pair ``W.lora_a`` (``[n_in, r]``) and ``W.lora_b``
(``[r, n_out]``), F32. numpy's shapes are ggml's reversed. The weight is ``W + scale * alpha / r *
B @ A``: an all-zero ``lora_b`` leaves the model exactly as it is.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter


def write_lora(
    path: Path,
    base: Path,
    *,
    seed: int = 0,
    rank: int = 8,
    alpha: float = 8.0,
    zero_b: bool = False,
    std: float = 0.2,
    targets: tuple[str, ...] = ("attn_q", "attn_v"),
    embedding: int | None = None,
) -> Path:
    """An adapter of ``base``'s ``targets`` in every block; ``embedding`` overrides the input size
    (an adapter made for a model of another width, which llama-server refuses)."""
    reader = GGUFReader(base)
    arch = str(reader.fields["general.architecture"].contents())
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    blocks = int(reader.fields[f"{arch}.block_count"].contents())
    for il in range(blocks):
        for target in targets:
            name = f"blk.{il}.{target}.weight"
            n_in, n_out = shapes[name][:2]
            n_in = embedding or n_in
            a = rng.normal(0.0, std, size=(rank, n_in)).astype(np.float32)
            b = np.zeros((n_out, rank), np.float32) if zero_b else rng.normal(0.0, std, size=(n_out, rank))
            w.add_tensor(f"{name}.lora_a", a)
            w.add_tensor(f"{name}.lora_b", np.asarray(b, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
