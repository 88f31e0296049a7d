"""The backends table is the one place that knows which kinds of child server there are: the
config's names and the supervisor's entries agree, and no module outside the two tables asks
``backend == "whisper"`` (read from the package's syntax trees)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import rocmforge_supervisor
from rocmforge_supervisor.config._backends import BACKEND_NAMES, BackendName
from rocmforge_supervisor.supervisor import BACKENDS

PACKAGE = Path(rocmforge_supervisor.__file__).parent
TABLES = {Path("config/_backends.py"), Path("supervisor/backends/_backends.py")}


def test_the_config_and_the_supervisor_name_the_same_backends() -> None:
    assert tuple(BACKENDS) == BACKEND_NAMES == get_args(BackendName)
    assert all(entry.name == name for name, entry in BACKENDS.items())


def _asks_for_a_backend(tree: ast.AST) -> list[int]:
    """Comparisons of something named ``backend`` with a backend's name."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any(
            (isinstance(s, ast.Attribute) and s.attr == "backend")
            or (isinstance(s, ast.Name) and s.id == "backend")
            for s in sides
        )
        literal = any(isinstance(s, ast.Constant) and s.value in BACKEND_NAMES for s in sides)
        if named and literal:
            found.append(node.lineno)
    return found


def test_no_module_outside_the_tables_asks_which_backend() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel in TABLES:
            continue
        found += [f"{rel}:{n}" for n in _asks_for_a_backend(ast.parse(path.read_text(), str(path)))]
    assert not found, "backend == ... outside the backends tables: " + ", ".join(found)


def test_the_check_sees_a_question() -> None:
    code = 'if m.config.backend == "whisper": pass\nif backend != "command": pass\nif b == "hip": pass\n'
    assert _asks_for_a_backend(ast.parse(code)) == [1, 2]


def test_each_backend_is_a_folder_whose_entry_is_in_the_table() -> None:
    """Adding a backend is its folder under supervisor/backends/ (making its ``BACKEND``) and one
    line of the table: every entry comes from the folder of its name, and every folder is listed."""
    import importlib

    folders = {
        p.parent.name
        for p in (PACKAGE / "supervisor" / "backends").glob("*/__init__.py")
        if not p.parent.name.startswith("_")
    }
    assert folders == set(BACKENDS)
    for name, entry in BACKENDS.items():
        module = importlib.import_module(f"rocmforge_supervisor.supervisor.backends.{name}")
        assert module.BACKEND is entry


def test_each_backends_own_keys_are_a_part_of_the_model_config() -> None:
    """A backend's own ``[models.NAME]`` keys are a class ``ModelConfig`` is made of, named by its
    entry; every such class belongs to one entry, and no key is in two of them."""
    from pydantic import BaseModel

    from rocmforge_supervisor.config import ModelConfig

    own = [entry.keys for entry in BACKENDS.values() if entry.keys is not None]
    assert len(own) == len(set(own)) and all(k in ModelConfig.__mro__[1:] for k in own)
    parts = {
        base
        for base in ModelConfig.__bases__
        if issubclass(base, BaseModel) and base.__name__.endswith("Keys")
    }
    assert parts == set(own)
    keys = [key for k in own for key in k.model_fields]
    assert len(keys) == len(set(keys))
