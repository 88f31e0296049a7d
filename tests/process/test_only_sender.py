"""``process/`` is the only place that sends a child a signal (design.md's first invariant): a
signal sent from anywhere else is a lifecycle of its own that the restart loop, the ledger and the
shielded stops know nothing about. Read from the package's syntax trees, not by grep on text, so a
comment or a docstring that names ``os.killpg`` does not count and an aliased call does."""

from __future__ import annotations

import ast
from pathlib import Path

import rocmforge_supervisor

PACKAGE = Path(rocmforge_supervisor.__file__).parent
#: Calls that signal a process: ``os.kill``/``os.killpg``, any ``send_signal``, and a Popen's or
#: psutil.Process's ``terminate()``/``kill()`` (no arguments: ``ModelServer.kill(reason)`` is the
#: supervisor asking process/ to do it, which is the rule).
OS_SENDERS = frozenset({"kill", "killpg"})
BARE_SENDERS = frozenset({"kill", "terminate"})


def _is_sender(call: ast.Call) -> bool:
    if not isinstance(call.func, ast.Attribute):
        return False
    attr, owner = call.func.attr, call.func.value
    if attr == "send_signal" or (attr in OS_SENDERS and isinstance(owner, ast.Name) and owner.id == "os"):
        return True
    return attr in BARE_SENDERS and not call.args and not call.keywords


def _senders(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and _is_sender(node)) or (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(a.name in ("kill", "killpg") for a in node.names)
        ):
            lines.append(node.lineno)
    return lines


def test_no_signal_is_sent_outside_process() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "process":
            continue
        found += [f"{rel}:{line}" for line in _senders(ast.parse(path.read_text(), str(path)))]
    assert not found, "signals sent outside process/: " + ", ".join(found)


def test_the_check_sees_a_sender() -> None:
    """The walk finds each form it looks for (else the test above could never fail)."""
    code = (
        "import os\nfrom os import killpg\nos.killpg(1, 9)\np.send_signal(2)\np.terminate()\np.kill()\n"
        "server.kill('stalled')\nos.kill(1, 0)\n"
    )
    assert sorted(_senders(ast.parse(code))) == [2, 3, 4, 5, 6, 8]
