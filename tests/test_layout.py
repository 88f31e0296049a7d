"""The test tree's layout: the fast folders run against the fake llama-server only.

A fast folder (:data:`FAST`) is one a change can be checked with on any machine, before the
compiled llama-server, RPC worker or whisper-server exist (``FORGE_LLAMA_SERVER=/nonexistent``
leaves its tests passing). A test there that needs a real binary belongs with the others that do:
tests/supervisor_real (the supervisor), tests/gateway (the gateway), and so on.

Read from the source (AST), not by running anything: a fixture needs a binary when it calls one of
the locators (:data:`LOCATORS`) or requests such a fixture, through every conftest.py and helper
module of the tree; a test in a fast folder may do neither.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

#: The folders whose tests need no compiled binary.
FAST = ("access", "activity", "batches", "config", "gateway_fast", "supervisor")

#: What finds a compiled binary (and raises BinaryNotFound, or skips, without one).
LOCATORS = frozenset(
    {"locate_llama_server", "locate_rpc_server", "locate_whisper_server", "whisper_server_or_skip"}
)


@dataclass(frozen=True)
class Function:
    """A function of a test module, conftest.py or helper: what it requests and calls."""

    path: Path
    name: str
    line: int
    fixture: bool
    requests: frozenset[str]
    calls: frozenset[str]

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(TESTS.parent)}:{self.line} {self.name}"


def _called(node: ast.AST) -> Iterator[str]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            f = sub.func
            if isinstance(f, ast.Name):
                yield f.id
            elif isinstance(f, ast.Attribute):
                yield f.attr


def _is_fixture(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            return True
        if isinstance(target, ast.Name) and target.id == "fixture":
            return True
    return False


def _used_fixtures(node: ast.AST) -> Iterator[str]:
    """The fixtures named in ``pytest.mark.usefixtures("a", …)`` (on a function or in a module's
    ``pytestmark``) and in ``request.getfixturevalue("a")``."""
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr in ("usefixtures", "getfixturevalue")
        ):
            yield from (a.value for a in sub.args if isinstance(a, ast.Constant) and isinstance(a.value, str))


def functions(path: Path, source: str | None = None) -> list[Function]:
    """The module-level functions (and methods) of ``path``, with a module's ``pytestmark``
    ``usefixtures`` counted as requested by each of its tests."""
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"), str(path))
    module_uses = {
        name
        for stmt in tree.body
        if isinstance(stmt, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets)
        for name in _used_fixtures(stmt.value)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            params = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
            named = {n for d in (*node.decorator_list, *node.body) for n in _used_fixtures(d)}
            uses = module_uses if node.name.startswith("test") else set()
            out.append(
                Function(
                    path,
                    node.name,
                    node.lineno,
                    _is_fixture(node),
                    frozenset(params | named | uses),
                    frozenset(_called(node)),
                )
            )
    return out


def needing_a_binary(funcs: Iterable[Function]) -> tuple[set[str], set[str]]:
    """(fixtures, helpers) that need a compiled binary: they call a locator, a helper that does,
    or request such a fixture; to a fixed point."""
    funcs = list(funcs)
    fixtures: set[str] = set()
    helpers: set[str] = set(LOCATORS)
    while True:
        grown = False
        for f in funcs:
            real = bool(f.calls & helpers) or bool(f.requests & fixtures)
            if not real or f.name.startswith("test"):
                continue
            found = fixtures if f.fixture else helpers
            if f.name not in found:
                found.add(f.name)
                grown = True
        if not grown:
            return fixtures, helpers


def _tree_functions() -> list[Function]:
    """Every conftest.py and helper module (not the test modules: their fixtures are their own)."""
    paths = [p for p in TESTS.rglob("*.py") if "fixtures" not in p.parts and not p.name.startswith("test_")]
    return [f for p in sorted(paths) for f in functions(p)]


def offenders(funcs: Iterable[Function], fixtures: set[str], helpers: set[str]) -> list[str]:
    """The tests and fixtures of fast-folder modules that need a binary, each with what it uses."""
    out = []
    for f in funcs:
        if not (f.name.startswith("test") or f.fixture):
            continue
        uses = sorted((f.requests & fixtures) | (f.calls & helpers))
        if uses:
            out.append(f"{f.where} uses {', '.join(uses)}")
    return out


def _fast_modules() -> list[Path]:
    return sorted(p for folder in FAST for p in (TESTS / folder).rglob("*.py"))


def test_the_fast_folders_need_no_compiled_binary() -> None:
    tree = _tree_functions()
    # The guard is not empty: the root conftest's binary fixtures are found as such.
    assert {"llama_server_bin", "llama_server_flags", "rpc_server_bin", "state_settings"} <= needing_a_binary(
        tree
    )[0]
    local = [f for p in _fast_modules() for f in functions(p)]
    # A fast module's own fixture or helper that needs a binary makes its tests need one too.
    fixtures, helpers = needing_a_binary([*tree, *local])
    found = offenders(local, fixtures, helpers)
    assert not found, (
        "tests in the fast folders need a compiled binary; move them where the real-binary tests "
        "live (tests/supervisor_real, tests/gateway, …):\n" + "\n".join(found)
    )


def test_every_fast_folder_exists() -> None:
    missing = [f for f in FAST if not (TESTS / f / "__init__.py").is_file()]
    assert not missing, f"FAST names folders that are not test packages: {missing}"


@pytest.mark.parametrize(
    "source",
    [
        "async def test_x(llama_server_bin): ...",
        "def test_x(state_settings): ...",
        "import pytest\n@pytest.mark.usefixtures('rpc_server_bin')\ndef test_x(): ...",
        "import pytest\npytestmark = pytest.mark.usefixtures('llama_server_flags')\ndef test_x(): ...",
        "def test_x(settings):\n    locate_llama_server(settings)",
        "import pytest\n@pytest.fixture\ndef real(llama_server_bin): ...\ndef test_x(real): ...",
        "def test_x(request):\n    request.getfixturevalue('llama_server_bin')",
        "def helper(s):\n    return whisper_server_or_skip(s)\ndef test_x(s):\n    helper(s)",
    ],
)
def test_the_guard_sees_each_way_a_test_reaches_a_binary(source: str) -> None:
    tree = _tree_functions()
    local = functions(TESTS / "supervisor" / "test_example.py", source)
    fixtures, helpers = needing_a_binary([*tree, *local])
    assert offenders(local, fixtures, helpers)


def test_the_guard_lets_the_fake_through() -> None:
    source = "async def test_x(make_config, fake_bin, tiny_gguf, gemma_path): ..."
    local = functions(TESTS / "supervisor" / "test_example.py", source)
    fixtures, helpers = needing_a_binary([*_tree_functions(), *local])
    assert offenders(local, fixtures, helpers) == []
