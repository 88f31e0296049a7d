"""Small file helpers shared by the build cache and the model cache."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

__all__ = ["sha256_file", "write_text_atomic"]


def write_text_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file in the same directory and one rename: a
    reader never sees half a file, and a failed write leaves neither a half file nor the temp."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_file(path: Path, block: int = 4 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()
