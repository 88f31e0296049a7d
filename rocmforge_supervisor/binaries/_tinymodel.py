"""The GGUF a new llama-server must serve one completion of before anything uses it (the self-test).

Random weights, 2 layers, about 1 MB, written by the package itself: no download, no model cache,
the same file on every machine. What matters is the *path* it takes through ggml, not its text:

- its matrices are ``Q4_0`` with rows and columns that are multiples of 32 (and of 256), so the CPU
  backend's "extra buffer types" take them exactly as they take a real model's: ``CPU_REPACK``
  (AVX2/AVX-512/NEON interleaving) and, on an Intel AMX CPU, ``AMX``, whose kernels crash at the
  pinned llama.cpp (PR #26954) on the first matrix multiply of a generated token;
- a real SentencePiece-style vocabulary (``<unk> <s> </s>`` and the 256 byte tokens, plus letters)
  so any prompt tokenises without a special case.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import gguf
import numpy as np

__all__ = ["N_SPECIAL_TOKENS", "SELFTEST_MODEL_NAME", "write_selftest_gguf"]

#: Bump when the file's content changes, so a stale cached copy is never reused.
SELFTEST_MODEL_NAME = "forge-selftest-q4_0-v1.gguf"

#: ``<unk> <s> </s>`` and the 256 byte tokens come first: ids below this are never words.
N_SPECIAL_TOKENS = 259

_N_EMBD = 256
_N_FF = 512
_N_LAYER = 2
_N_HEAD = 4
_N_CTX = 512


def _vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    words = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["\u2581" + chr(c) for c in range(97, 123)]
    tokens += words
    types += [gguf.TokenType.NORMAL] * len(words)
    while len(tokens) % 32:  # the output matrix's rows: a multiple of 32, like the others
        tokens.append(f"<pad{len(tokens)}>")
        types.append(gguf.TokenType.UNUSED)
    scores = [0.0] * N_SPECIAL_TOKENS + [-float(i) for i in range(len(tokens) - N_SPECIAL_TOKENS)]
    return tokens, scores, [int(t) for t in types]


def _q4_0(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    data = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    return gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q4_0)


def write_selftest_gguf(directory: Path) -> Path:
    """The self-test model in ``directory`` (written once, under a temporary name then renamed)."""
    path = directory / SELFTEST_MODEL_NAME
    if path.is_file():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    tokens, scores, types = _vocab()
    n_vocab = len(tokens)
    fd, tmp_name = tempfile.mkstemp(prefix=".selftest-", suffix=".gguf", dir=directory)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp_name, "llama")
        writer.add_name("forge-selftest")
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
        writer.add_context_length(_N_CTX)
        writer.add_embedding_length(_N_EMBD)
        writer.add_block_count(_N_LAYER)
        writer.add_feed_forward_length(_N_FF)
        writer.add_head_count(_N_HEAD)
        writer.add_head_count_kv(_N_HEAD)
        writer.add_rope_dimension_count(_N_EMBD // _N_HEAD)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_vocab_size(n_vocab)
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_unk_token_id(0)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        q4 = gguf.GGMLQuantizationType.Q4_0
        ones = np.ones(_N_EMBD, dtype=np.float32)
        embd = (rng.standard_normal((n_vocab, _N_EMBD)) * 0.05).astype(np.float32)
        writer.add_tensor("token_embd.weight", embd)
        for i in range(_N_LAYER):
            writer.add_tensor(f"blk.{i}.attn_norm.weight", ones)
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                writer.add_tensor(f"blk.{i}.{name}.weight", _q4_0(rng, _N_EMBD, _N_EMBD), raw_dtype=q4)
            writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
            writer.add_tensor(f"blk.{i}.ffn_gate.weight", _q4_0(rng, _N_FF, _N_EMBD), raw_dtype=q4)
            writer.add_tensor(f"blk.{i}.ffn_up.weight", _q4_0(rng, _N_FF, _N_EMBD), raw_dtype=q4)
            writer.add_tensor(f"blk.{i}.ffn_down.weight", _q4_0(rng, _N_EMBD, _N_FF), raw_dtype=q4)
        writer.add_tensor("output_norm.weight", ones)
        writer.add_tensor("output.weight", _q4_0(rng, n_vocab, _N_EMBD), raw_dtype=q4)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        Path(tmp_name).replace(path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path
