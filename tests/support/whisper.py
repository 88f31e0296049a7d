"""The whisper backend's test parts: the project's whisper-server, a whisper model, spoken audio.

- whisper-server: the one ``make test`` builds (``forge build --whisper``), found the way
  ``forge serve`` finds it; the tests skip, saying so, where none is built.
- The model: no registry these machines reach ships trained whisper weights in whisper.cpp's
  format (PyPI's bundled whisper models are CTranslate2 or PyTorch files), so the tests run on
  whisper.cpp's own ``for-tests-ggml-tiny.bin`` from the pinned source: tiny's real shapes and
  vocabulary with no weights. whisper-server loads it, decodes the audio and runs the encoder and
  decoder on it, so every byte of the plumbing is real; the text it produces is empty. Set
  ``FORGE_TEST_WHISPER_MODEL`` to a real model (``ggml-tiny.en.bin``) and the tests also check
  the words.
- The audio: ``espeak-ng`` (Debian; ``make test`` installs it) speaking :data:`SENTENCE` into a
  WAV (22.05 kHz mono: whisper-server resamples it itself).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rocmforge_supervisor.config import ForgeSettings

SENTENCE = "The quick brown fox jumps over the lazy dog."


def whisper_server_or_skip(settings: ForgeSettings) -> Path:
    from rocmforge_supervisor._errors import BinaryNotFound
    from rocmforge_supervisor.build import locate_whisper_server

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
    from rocmforge_supervisor.build._whisper import _source_tree

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
