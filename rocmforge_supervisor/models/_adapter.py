"""A LoRA adapter judged against its base model before anything starts.

llama-server checks an adapter only while loading it (``llama_adapter_lora_init_impl`` in the pinned
``src/llama-adapter.cpp``) and a mismatch stops the whole child (``model arch and LoRA arch
mismatch``, ``tensor '…' has incorrect shape (hint: maybe wrong base model?)``). These are the same
checks on the two GGUF headers, so that the config is refused with both names instead:

* ``general.type`` is ``adapter`` and ``adapter.type`` is ``lora``;
* ``general.architecture`` is the model's;
* every ``X.lora_a`` / ``X.lora_b`` pair names a tensor ``X`` of the model and fits its shape:
  ``lora_a`` is ``[n_in, r]`` and ``lora_b`` ``[r, n_out]`` for a ``[n_in, n_out]`` weight (ggml's
  order), so an adapter made for another embedding size is told by the first tensor that differs.
"""

from __future__ import annotations

from pathlib import Path

from .._errors import ConfigError
from ._gguf import _read, _value

__all__ = ["adapter_mismatch", "check_adapter"]


def adapter_mismatch(model: Path, adapter: Path) -> str | None:
    """Why the adapter cannot be applied to the model, in llama.cpp's order; None: it can."""
    base, lora = _read(model), _read(adapter)
    kind, ltype = _value(lora, "general.type"), _value(lora, "adapter.type")
    if kind != "adapter" or ltype != "lora":
        return f"it is no LoRA adapter (general.type {kind!r}, adapter.type {ltype!r})"
    arch_m, arch_a = _value(base, "general.architecture"), _value(lora, "general.architecture")
    if arch_m != arch_a:
        return f"it is for the {arch_a!r} architecture, the model is {arch_m!r}"
    if _value(lora, "adapter.lora.alpha") is None:
        return "it has no adapter.lora.alpha"
    shapes = {t.name: [int(n) for n in t.shape] for t in base.tensors}
    pairs: dict[str, dict[str, list[int]]] = {}
    for t in lora.tensors:
        stem, dot, part = t.name.rpartition(".")
        if not dot or part not in ("lora_a", "lora_b"):
            return f"its tensor {t.name!r} is not a .lora_a or .lora_b"
        pairs.setdefault(stem, {})[part] = [int(n) for n in t.shape]
    embd = _value(base, f"{arch_m}.embedding_length")
    for stem, pair in pairs.items():
        if len(pair) != 2:
            return f"its tensor pair for {stem!r} is missing one of .lora_a / .lora_b"
        if stem not in shapes:
            return f"its tensor {stem!r} is not in the model"
        w, a, b = shapes[stem], pair["lora_a"], pair["lora_b"]
        if len(a) < 2 or len(b) < 2 or len(w) < 2 or stem.endswith("token_embd.weight"):
            continue  # llama.cpp's token_embd rule is its own (a and b transposed); left to it
        if a[0] != w[0] or b[1] != w[1] or a[1] != b[0]:
            return (
                f"its {stem} is {a[0]}x{b[1]}, the model's is {w[0]}x{w[1]} "
                f"(the model's embedding size is {embd}): it was made for another base model"
            )
    return None


def check_adapter(model: Path, adapter: Path, *, key: str = "adapters") -> None:
    """A :class:`ConfigError` naming ``key`` and both files when the adapter does not fit."""
    why = adapter_mismatch(model, adapter)
    if why is not None:
        raise ConfigError(
            f"{key}: {adapter.name} cannot be applied to {model.name} ({why}); "
            "llama-server would refuse to start",
            key=key,
            hint="use an adapter trained on this model (or point path at the model it was trained on)",
        )
