"""Names of a package imported on first use (PEP 562), for start-up time.

Every ``forge`` command imports the packages it uses; a package ``__init__`` that imported all of
its modules would make ``forge --help`` pay for pydantic-settings, httpx, gguf and numpy. A package
lists its names in a ``TYPE_CHECKING`` block (so mypy and readers see them) and hands this module
the same names, by module, for the interpreter.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, modules: Mapping[str, Iterable[str]]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: ``modules`` maps a submodule (``"._file"``) to the
    names it gives the package. A name is imported once, then kept in the package's namespace."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
