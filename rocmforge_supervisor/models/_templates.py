"""A chat template for GGUFs that carry none.

llama-server falls back to ChatML when a GGUF has no ``tokenizer.chat_template``; for a model
trained on another format that gives garbage (seen with the embedded gemma-3-270m GGUF, whose
replies echoed ``<|im_end|>``). Where the architecture names its format unambiguously, pass
llama.cpp's built-in template of that name instead. A user's own template flags always win.

The built-in names only work without jinja: with jinja on (the server's default) ``--chat-template
gemma`` is taken as a literal Jinja template and every prompt renders as the word "gemma" (seen
through ``/apply-template``). Hence ``--no-jinja`` with it; a GGUF without a template has no tool
template either, so nothing that jinja would add is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["fallback_chat_template_args"]

#: Architectures whose chat format is unambiguous → llama.cpp built-in template name.
_BY_ARCH = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
    "phi3": "phi3",
    "command-r": "command-r",
    "cohere2": "command-r",
    "deepseek2": "deepseek2",
    "exaone": "exaone3",
}

_TEMPLATE_FLAGS = (
    "--chat-template",
    "--chat-template-file",
    "--chat-template-kwargs",
    "--jinja",
    "--no-jinja",
)


def fallback_chat_template_args(info: Any, extra_args: Sequence[str]) -> list[str]:
    if getattr(info, "has_chat_template", True):
        return []
    if any(a.split("=", 1)[0] in _TEMPLATE_FLAGS for a in extra_args):
        return []
    name = _BY_ARCH.get(str(getattr(info, "architecture", "")))
    return ["--no-jinja", "--chat-template", name] if name else []
