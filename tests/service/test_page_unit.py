"""The status page's pure parts: which Origin counts as the page's own, what the page paths are."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path
from typing import Any

from rocmforge_supervisor.service.control._page import CSP, PAGE_PATHS, STATIC
from rocmforge_supervisor.service.edge._middleware import same_origin


def _scope(host: str | None, scheme: str = "http") -> dict[str, Any]:
    headers = [(b"host", host.encode())] if host is not None else []
    return {"type": "http", "scheme": scheme, "headers": headers}


def test_same_origin_needs_the_exact_origin() -> None:
    assert same_origin(_scope("192.168.1.20:8080"), "http://192.168.1.20:8080", keyed=False)
    assert same_origin(_scope("[fd00::2]:8080"), "http://[fd00::2]:8080", keyed=False)
    assert not same_origin(_scope("192.168.1.20:8080"), "http://192.168.1.20:9090", keyed=True)
    assert not same_origin(_scope("192.168.1.20:8080"), "https://192.168.1.20:8080", keyed=True)
    assert not same_origin(_scope(None), "http://192.168.1.20:8080", keyed=True)


def test_a_host_name_counts_only_with_a_key() -> None:
    # DNS rebinding: a foreign page can point its own name at this address; it has no key.
    assert not same_origin(_scope("gpubox.lan:8080"), "http://gpubox.lan:8080", keyed=False)
    assert same_origin(_scope("gpubox.lan:8080"), "http://gpubox.lan:8080", keyed=True)


def test_page_paths_are_the_shipped_files_and_nothing_else() -> None:
    files = {p.name for p in STATIC.iterdir() if p.is_file()}
    assert {"index.html", "app.js", "style.css"} <= files
    assert {"/", *(f"/ui/{f}" for f in files)} == set(PAGE_PATHS)
    assert not any(p.startswith("/api") or p.startswith("/v1") for p in PAGE_PATHS)
    assert "'unsafe-inline'" not in CSP and "default-src 'none'" in CSP


def test_the_page_has_no_inline_script_or_style() -> None:
    html = (STATIC / "index.html").read_text()
    assert "<style" not in html and " style=" not in html and "javascript:" not in html
    assert html.count("<script") == 1 and 'src="/ui/app.js"' in html
    for js in STATIC.glob("*.js"):
        assert "innerHTML" not in js.read_text(), js.name  # text goes in as text


def test_every_page_file_is_package_data() -> None:
    """An installed package must carry the page: every file under static/ matches a package-data glob."""
    root = Path(__file__).resolve().parents[2]
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["rocmforge_supervisor"]
    package = root / "rocmforge_supervisor"
    for f in STATIC.rglob("*"):
        if f.is_file():
            rel = f.relative_to(package).as_posix()
            assert any(fnmatch.fnmatch(rel, g) and rel.count("/") == g.count("/") for g in globs), rel
