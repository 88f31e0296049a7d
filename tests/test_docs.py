"""The documentation's examples work: every forge config in a ```toml block of README.md and
docs/*.md passes `forge serve --check-config`, every ```python block compiles, and every relative
link (and its #anchor) points at something that exists.

Markers, an HTML comment on the line just before a block (invisible once rendered):

* ``<!-- fragment -->``: a piece of a config on purpose; not checked.
* ``<!-- files: /etc/rocmforge/ci.key … -->``: files the example reads at config time (key files,
  TLS pairs, local adapters). The test makes them in a temporary folder and points the block there;
  a ``tls_cert``/``tls_key`` pair among them becomes a real self-signed pair.

A model path that does not exist is fine as it is: `--check-config` only notes it (a volume may
bring it before the first load)."""

from __future__ import annotations

import os
import re
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rocmforge_supervisor._errors import ModelNotFound
from rocmforge_supervisor.cli.main import app
from tests.support.tls import self_signed

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: A fenced block, with the HTML comment (if any) on the line just before it.
_FENCE = re.compile(r"(?:^<!--(?P<marker>.*?)-->\n)?^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$", re.M | re.S)
#: What makes a toml block a forge config rather than some other TOML.
_FORGE_TABLE = re.compile(r"^\[\[?(models\.|server\b|supervisor\b|groups\.|workers\b|peers\.)", re.M)
_LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    lang: str
    body: str
    marker: str

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def _blocks() -> list[Block]:
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            line = text.count("\n", 0, m.start("lang")) + 1
            out.append(Block(doc, line, m["lang"], m["body"], (m["marker"] or "").strip()))
    return out


BLOCKS = _blocks()
CONFIGS = [b for b in BLOCKS if b.lang == "toml" and _FORGE_TABLE.search(b.body)]
PYTHON = [b for b in BLOCKS if b.lang == "python"]


def _without_code(text: str) -> str:
    """The prose: fenced blocks and inline code removed (a `# comment` in a block is no heading)."""
    text = re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)
    return _INLINE_CODE.sub("", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped (not - or _), spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()  # a link's text only
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
    seen: dict[str, int] = {}
    anchors = set()
    for m in _HEADING.finditer(text):
        slug = _slug(m[2])
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_the_docs_hold_their_examples() -> None:
    """The extraction finds what is there (a broken pattern would pass every check below)."""
    assert (ROOT / "docs").is_dir() and len(DOCS) >= 8
    assert len(CONFIGS) >= 15 and len(PYTHON) >= 4
    fragments = [b.id for b in CONFIGS if b.marker == "fragment"]
    assert len(fragments) <= 3, f"most examples should be whole configs: {fragments}"


def test_the_readme_stays_a_guide() -> None:
    """The reference lives in docs/; README.md is the way in."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines < 400, f"README.md has {lines} lines: move reference material to docs/"


def _materialize(block: Block, folder: Path) -> str:
    """The block's text with the files its ``files:`` marker names made under ``folder``."""
    body = block.body
    names = block.marker.removeprefix("files:").split() if block.marker.startswith("files:") else []
    made: dict[str, Path] = {}
    for name in names:
        assert name in body, f"{block.id}: the marker names {name}, which the block does not use"
        made[name] = folder / "files" / name.lstrip("/")
        made[name].parent.mkdir(parents=True, exist_ok=True)
        body = body.replace(name, str(made[name]))
    server = tomllib.loads(body).get("server", {})
    cert, key = server.get("tls_cert"), server.get("tls_key")
    tls = {str(p) for p in made.values()} & {cert, key}
    if tls:
        assert cert in tls and key in tls, f"{block.id}: a TLS pair needs both files in the marker"
        made_cert, made_key = self_signed(folder / "tls")
        shutil.copyfile(made_cert, cert)
        shutil.copyfile(made_key, key)
    for path in made.values():
        if not path.exists():
            path.write_text("docs-example-" + os.urandom(12).hex() + "\n")
            path.chmod(0o600)
    return body


@pytest.mark.timeout(30)
@pytest.mark.parametrize("block", CONFIGS, ids=[b.id for b in CONFIGS])
def test_config_example_passes_check_config(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`forge serve --check-config` in-process (the same function the command runs)."""
    if block.marker == "fragment":
        pytest.skip("marked <!-- fragment -->")
    for var in [v for v in os.environ if v.upper().startswith("FORGE_")]:
        monkeypatch.delenv(var)  # FORGE_API_KEY, FORGE_SERVER__*: the block alone decides
    monkeypatch.setenv("FORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FORGE_STATE_DIR", str(tmp_path / "state"))

    def no_fetch(name: str, *_: object) -> Path:  # bounded: a short name's model is never fetched
        raise ModelNotFound(f"{name}: not fetched by the docs test")

    monkeypatch.setattr("rocmforge_supervisor.models.ensure_embedded", no_fetch)
    config = tmp_path / "forge.toml"
    config.write_text(_materialize(block, tmp_path), encoding="utf-8")
    result = CliRunner().invoke(app, ["serve", "--check-config", "--config", str(config)])
    detail = f"{block.id}:\n{block.body}\n{result.output}{result.exception!r}"
    assert result.exit_code == 0 and result.exception is None, detail
    assert "config OK" in result.output, detail


@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_python_example_compiles(block: Block) -> None:
    compile(block.body, block.id, "exec")


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_relative_links_resolve(doc: Path) -> None:
    """Every link that is not a URL points at a file or folder of the repository, and its
    #anchor, in a Markdown file, at one of that file's headings."""
    broken = []
    for target in _LINK.findall(_without_code(doc.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no {dest}")
        elif not dest.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)
