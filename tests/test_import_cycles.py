"""No import circle among forge's modules, counting imports made only for annotations
(scripts/audit/import_cycles.py): import-linter's contracts in pyproject.toml check the layers
between packages and rooms; this checks every module against every other."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "audit"))

from import_cycles import circles, import_graph  # noqa: E402


def test_circles_finds_a_circle_of_annotations_and_nothing_in_a_line() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert circles({"a": {"b", "c"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}) == [["c", "d"], ["a", "b"]]


def test_no_module_of_the_package_is_in_an_import_circle() -> None:
    edges = import_graph()
    assert "rocmforge_supervisor.supervisor.model._managed" in edges  # the graph is the package's
    # the model's rooms import its protocol, not the class (annotations counted)
    assert (
        "rocmforge_supervisor.supervisor.model._managed"
        not in edges["rocmforge_supervisor.supervisor.model._status"]
    )
    assert circles(edges) == []


def test_the_script_prints_the_count() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "audit" / "import_cycles.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("0 circles")
