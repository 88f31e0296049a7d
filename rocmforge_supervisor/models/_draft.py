"""A draft model for speculative decoding, judged against its target before anything starts.

llama-server compares the two vocabularies only once both are loaded
(``common_speculative_are_compatible`` in the pinned ``common/speculative.cpp``), and a mismatch
does not stop it: it logs ``the target and draft vocabs are not compatible`` and ``failed to
initialize speculative decoding context: draft model vocab type must match target model to use
speculation``, then serves without drafting, with the draft's weights still in memory. This is
the same comparison on the two GGUFs' metadata, so that the config is refused instead:

* the tokenizer kind (``tokenizer.ggml.model``: ``gpt2``, ``llama``…), the vocab type;
* whether a BOS (and an EOS) token is added, and which one when it is;
* the vocabulary sizes may differ by at most 128 tokens;
* every token text from id 5 on (the first ids are special tokens that may differ) is the same.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from gguf import GGUFEndian, GGUFReader, GGUFValueType

from .._errors import ConfigError
from ._gguf import _read, _value

__all__ = ["check_draft_vocab", "declares_spec_type", "vocab_mismatch"]

#: llama.cpp's ``SPEC_VOCAB_MAX_SIZE_DIFFERENCE`` and ``SPEC_VOCAB_CHECK_START_TOKEN_ID``.
_MAX_SIZE_DIFFERENCE = 128
_CHECK_FROM = 5


def _tokens(reader: GGUFReader) -> list[bytes]:
    """``tokenizer.ggml.tokens``, every entry (the header reader keeps long arrays as one blob)."""
    f = reader.fields.get("tokenizer.ggml.tokens")
    if f is None or not f.types or f.types[0] != GGUFValueType.ARRAY:
        return []
    if f.data:  # a short array, read the stock way
        return [bytes(f.parts[i]) for i in f.data]
    blob = f.parts[-1].tobytes()
    unpack = struct.Struct("<Q" if reader.endianess == GGUFEndian.LITTLE else ">Q").unpack_from
    out, pos = [], 0
    while pos + 8 <= len(blob):
        n = unpack(blob, pos)[0]
        out.append(blob[pos + 8 : pos + 8 + n])
        pos += 8 + n
    return out


def _special(reader: GGUFReader, which: str) -> tuple[Any, Any]:
    return _value(reader, f"tokenizer.ggml.add_{which}_token"), _value(
        reader, f"tokenizer.ggml.{which}_token_id"
    )


def vocab_mismatch(model: Path, draft: Path) -> str | None:
    """How the draft's vocabulary differs from the model's, in llama.cpp's order; None: it matches."""
    tgt, dft = _read(model), _read(draft)
    kind_t, kind_d = _value(tgt, "tokenizer.ggml.model"), _value(dft, "tokenizer.ggml.model")
    if kind_t != kind_d:
        return f"its tokenizer is {kind_d!r}, the model's is {kind_t!r}"
    for which in ("bos", "eos"):
        (add_t, id_t), (add_d, id_d) = _special(tgt, which), _special(dft, which)
        if add_t is not None and add_d is not None and bool(add_t) != bool(add_d):
            return f"it {'adds' if add_d else 'does not add'} a {which.upper()} token and the model does not"
        if (add_t or add_d) and id_t != id_d:
            return f"its {which.upper()} token is id {id_d}, the model's is id {id_t}"
    toks_t, toks_d = _tokens(tgt), _tokens(dft)
    if abs(len(toks_t) - len(toks_d)) > _MAX_SIZE_DIFFERENCE:
        return (
            f"it has {len(toks_d):,} tokens, the model {len(toks_t):,} (at most {_MAX_SIZE_DIFFERENCE} apart)"
        )
    for i in range(_CHECK_FROM, min(len(toks_t), len(toks_d))):
        if toks_t[i] != toks_d[i]:
            shown_t, shown_d = (t.decode("utf-8", "replace") for t in (toks_t[i], toks_d[i]))
            return f"token {i} is {shown_d!r} in it and {shown_t!r} in the model"
    return None


def check_draft_vocab(model: Path, draft: Path, *, key: str = "draft") -> None:
    """A :class:`ConfigError` naming ``key`` when the draft cannot draft for the model."""
    why = vocab_mismatch(model, draft)
    if why is not None:
        raise ConfigError(
            f"{key}: {draft.name} does not share the vocabulary of {model.name} ({why}); "
            "llama-server would load it and never draft",
            key=key,
            hint="use a smaller model of the same family (the same tokenizer) as the draft",
        )


def declares_spec_type(draft: Path) -> bool:
    """Whether llama-server picks the draft's speculative type from its GGUF (an MTP head, a
    DFlash/DSpark draft: ``common_speculative_types_from_gguf``); forge then names none itself."""
    reader = _read(draft)
    arch = _value(reader, "general.architecture")
    if arch == "dflash":
        return True
    blocks = _value(reader, f"{arch}.block_count")
    if not isinstance(blocks, int) or blocks < 1:
        return False
    head = f"blk.{blocks - 1}.nextn.eh_proj.weight"
    return any(t.name == head for t in reader.tensors)
