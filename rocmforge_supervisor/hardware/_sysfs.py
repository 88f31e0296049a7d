"""Reading sysfs files: small, decimal or hex text, each read whole in one call.

Hand-written because the formats are tiny and exact (``key value`` lines, one number per file), and
no maintained library reads KFD topology; amdsmi needs ROCm's C library, which is often absent.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "PropertiesError",
    "listdir",
    "parse_properties",
    "read_text",
    "try_read_int",
    "try_read_text",
]


class PropertiesError(ValueError):
    """A KFD ``properties`` file that is not ``name value`` lines of decimal numbers.

    ``partial`` holds the lines read before the bad one (what ROCm's thunk would have read).
    """

    def __init__(self, message: str, partial: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.partial = partial or {}


def read_text(path: Path | str) -> str:
    """The file's text (undecodable bytes replaced). Raises OSError as the kernel reports it."""
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def try_read_text(path: Path | str) -> str | None:
    """The file's text stripped of surrounding whitespace, or None when it cannot be read."""
    try:
        return read_text(path).strip()
    except OSError:
        return None


def try_read_int(path: Path | str, base: int = 10) -> int | None:
    """A number file (``17163091968``, ``0x1002``), or None when missing or not a number."""
    text = try_read_text(path)
    if not text:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


def parse_properties(text: str) -> dict[str, int]:
    """Parse a KFD ``properties`` file: one ``name value`` per line, value decimal.

    Every line must parse: the kernel never writes anything else, so a line that does not is a
    corrupted (or not-a-sysfs) file and the whole node is reported as such rather than half-read.
    """
    if not text.strip():
        raise PropertiesError("empty file")
    props: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        name, sep, value = line.partition(" ")
        if not sep or not name or not value.isdigit() or not value.isascii():
            raise PropertiesError(f"line {number} is not 'name value': {line[:60]!r}", props)
        props[name] = int(value)
    return props


def listdir(path: Path) -> list[str]:
    """Entries of a directory, or none when it is missing or unreadable."""
    try:
        return [entry.name for entry in path.iterdir()]
    except OSError:
        return []
