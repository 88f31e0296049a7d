"""A tiny random-weight llama GGUF that the real llama-server loads in a fraction of a second.

Why not only the 241 MB gemma: tests that start and stop many servers (restarts, crashes,
placement) should not pay a real model's load each time. The weights are random, so the text is
gibberish, but the file goes through the same loader, tokenizer, chat template and sampler as any
real model, which is what those tests exercise.

The vocabulary is a real SentencePiece-style ("llama") one: ``<unk>``, ``<s>``, ``</s>``, the 256
byte-fallback tokens ``<0x00>``…``<0xFF>``, the two ChatML control tokens, and a few hundred word
pieces with scores. Every intermediate piece of every word is present too, so the SPM merge loop
can actually reach the whole words when it tokenizes English.

Steering random weights: embedding dimension 0 is a constant "bias channel". Every token embeds
with the same large value there, no layer reads it (column 0 of every input projection is zero) or
writes it (row 0 of every output projection is zero), so after the final RMS norm it is the same
positive number for every position. Column 0 of ``output.weight`` then acts as a per-token logit
bias. By default it pushes the control and byte tokens out of reach, so the model only emits word
pieces: always valid UTF-8, never EOS, every generation runs to ``max_tokens`` (finish_reason
``"length"``). With ``invalid_utf8=True`` it instead favours the lone UTF-8 continuation bytes
``<0x80>``…``<0xBF>``: the text is never valid UTF-8, and llama-server's chat parser fails on it
with a real mid-stream error (``data: {"error":{"code":500,…,"type":"server_error"}}``, no
``[DONE]``), which no real model produces on demand.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

__all__ = ["CHATML_TEMPLATE", "TINY_N_CTX", "TINY_N_EMBD", "TOOLS_TEMPLATE", "write_tiny_gguf"]

TINY_N_CTX = 2048
TINY_N_EMBD = 64
_N_LAYER = 2
_N_HEAD = 4
_N_HEAD_KV = 2  # GQA: two query heads share each key/value head
_N_FF = 128

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: ChatML that also renders ``tools``: llama-server (with jinja) then accepts tool requests, and a
#: client looking for tool support (VS Code Copilot through /api/show) sees it.
TOOLS_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\nTools:\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\n' }}{% endfor %}{{ '<|im_end|>\n' }}{% endif %}"
    + CHATML_TEMPLATE
)
_FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")

_SPACE = "\u2581"  # SentencePiece's visible space

_WORDS = """
the of and to a in is it you that he was for on are with as his they be at one have this from
or had by hot word but what some we can out other were all there when up use your how said an
each she which do their time if will way about many then them write would like so these her long
make thing see him two has look more day could go come did number sound no most people my over
know water than call first who may down side been now find any new work part take get place made
live where after back little only round man year came show every good me give our under name very
through just form sentence great think say help low line differ turn cause much mean before move
right boy old too same tell does set three want air well also play small end put home read hand
port large spell add even land here must big high such follow act why ask men change went light
kind off need house picture try us again animal point mother world near build self earth father
head stand own page should country found answer school grow study still learn plant cover food sun
four between state keep eye never last let thought city tree cross farm hard start might story saw
far sea draw left late run while press close night real life few north open seem together next
white children begin got walk example ease paper group always music those both mark often letter
until mile river car feet care second book carry took science eat room friend began idea fish
mountain stop once base hear horse cut sure watch color face wood main enough plain girl usual
young ready above ever red list though feel talk bird soon body dog family direct pose leave song
measure door product black short numeral class wind question happen complete ship area half rock
order fire south problem piece told knew pass since top whole king space heard best hour better
true during hundred five remember step early hold west ground interest reach fast verb sing listen
six table travel less morning ten simple several vowel toward war lay against pattern slow center
love person money serve appear road map rain rule govern pull cold notice voice unit power town
"""


def _vocab() -> tuple[list[str], list[float], list[int]]:
    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    types: list[int] = [
        gguf.TokenType.UNKNOWN,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
    ]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    tokens += ["<|im_start|>", "<|im_end|>"]
    types += [gguf.TokenType.CONTROL] * 2
    n_special = len(tokens)

    pieces: list[str] = []
    seen: set[str] = set()

    def add(piece: str) -> None:
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)

    for ch in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"-:;()" + _SPACE:
        add(ch)
    for word in _WORDS.split():
        full = _SPACE + word
        for end in range(2, len(full) + 1):  # every prefix, so SPM merges can build the word
            add(full[:end])
    tokens += pieces
    types += [gguf.TokenType.NORMAL] * len(pieces)
    # SPM merges the adjacent pair whose joined piece scores highest: longer pieces score higher.
    scores = [0.0] * n_special + [float(len(p)) - i * 1e-4 for i, p in enumerate(pieces)]
    return tokens, scores, [int(t) for t in types]


_BIAS_CHANNEL = 16.0  # embedding value of dimension 0: ~7 after the final RMS norm
_LOGIT_PUSH = 4.0  # times ~7: a logit offset of ~28, i.e. a probability factor of ~e^28


def write_tiny_gguf(
    path: Path,
    *,
    seed: int = 0,
    invalid_utf8: bool = False,
    chat_template: str = CHATML_TEMPLATE,
    fim: bool = False,
) -> Path:
    """Write the tiny model to ``path`` (same arguments, same bytes) and return ``path``.

    ``invalid_utf8=True`` makes a model whose chat streams fail mid-stream (see the module doc).
    ``fim=True`` adds fill-in-the-middle control tokens, so llama-server's ``/infill`` accepts it.
    """
    tokens, scores, types = _vocab()
    if fim:
        tokens += list(_FIM_TOKENS)
        scores += [0.0] * len(_FIM_TOKENS)
        types += [int(gguf.TokenType.CONTROL)] * len(_FIM_TOKENS)
    n_vocab = len(tokens)
    head_dim = TINY_N_EMBD // _N_HEAD
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:  # numpy (out, in) = GGUF {in, out}
        weights: np.ndarray = rng.standard_normal((rows, cols), dtype=np.float32) / np.float32(np.sqrt(cols))
        return weights

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def reads(rows: int, cols: int) -> np.ndarray:  # a projection out of the residual stream
        weights = mat(rows, cols)
        weights[:, 0] = 0.0  # blind to the bias channel
        return weights

    def writes(rows: int, cols: int) -> np.ndarray:  # a projection into the residual stream
        weights = mat(rows, cols)
        weights[0, :] = 0.0  # never disturbs the bias channel
        return weights

    embd = mat(n_vocab, TINY_N_EMBD)
    embd[:, 0] = _BIAS_CHANNEL
    output = reads(n_vocab, TINY_N_EMBD)
    byte = np.array([t == gguf.TokenType.BYTE for t in types])
    special = np.array([t in (gguf.TokenType.CONTROL, gguf.TokenType.UNKNOWN) for t in types])
    if invalid_utf8:
        continuation = np.array([tok in {f"<0x{b:02X}>" for b in range(0x80, 0xC0)} for tok in tokens])
        output[special | (byte & ~continuation), 0] = -_LOGIT_PUSH
        output[continuation, 0] = _LOGIT_PUSH
    else:
        output[special | byte, 0] = -_LOGIT_PUSH

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny-llama-test")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(TINY_N_CTX)
    writer.add_embedding_length(TINY_N_EMBD)
    writer.add_block_count(_N_LAYER)
    writer.add_feed_forward_length(_N_FF)
    writer.add_head_count(_N_HEAD)
    writer.add_head_count_kv(_N_HEAD_KV)
    writer.add_rope_dimension_count(head_dim)
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
    writer.add_eot_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(chat_template)
    if fim:
        for key, token in zip(("fim_pre", "fim_suf", "fim_mid"), _FIM_TOKENS, strict=True):
            writer.add_uint32(f"tokenizer.ggml.{key}_token_id", tokens.index(token))

    writer.add_tensor("token_embd.weight", embd)
    for i in range(_N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones(TINY_N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_q.weight", reads(_N_HEAD * head_dim, TINY_N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_k.weight", reads(_N_HEAD_KV * head_dim, TINY_N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_v.weight", reads(_N_HEAD_KV * head_dim, TINY_N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_output.weight", writes(TINY_N_EMBD, _N_HEAD * head_dim))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones(TINY_N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", reads(_N_FF, TINY_N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", reads(_N_FF, TINY_N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", writes(TINY_N_EMBD, _N_FF))
    writer.add_tensor("output_norm.weight", ones(TINY_N_EMBD))
    writer.add_tensor("output.weight", output)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
