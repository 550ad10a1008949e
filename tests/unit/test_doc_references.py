"""The repository stands alone: every link and cited path in docs, docstrings and comments exists.

Three checks over the prose of every text file of the repository: Markdown files whole, and the
docstrings and comments of Python, YAML, TOML, shell, Go, .proto files and Dockerfiles (code
itself is left alone: a string in code is not a citation):

* a relative Markdown link ``[text](path#anchor)`` names a file or folder of the repository, and
  its ``#anchor``, if any, a heading of that Markdown file (GitHub's anchor rule);
* a cited repository path (``docs/protocol.md``, ``tests/testdata/identity/``, ``nvmlsim/...``,
  globs included) exists, relative to the repository, to the citing file's folder or to its
  distribution (``nvmlsim/`` and ``nvmlsim/src/`` for the simulator's files, ``collector/`` for the
  Go module's), or is a path git ignores (generated output such as ``benchmarks/results/``);
* every ``*.md`` file named exists the same way (a bare name may also be a page of ``docs/``),
  so a note kept outside the repository cannot be cited by name.

Files of other repositories are cited by URL (a link's text included); URLs are not fetched (no
network in tests).
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {
    ".git",
    "node_modules",
    "_build",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "results",  # benchmarks/results: generated
    "golden",  # tests/testdata/golden: generated OTLP/JSON
    "gpumetricsv1",  # generated Go code
}
TEXT_SUFFIXES = {".md", ".py", ".pyi", ".yaml", ".yml", ".toml", ".sh", ".go", ".proto", ".txt"}
TOP_DIRS = (
    "benchmarks",
    "collector",
    "collector-config",
    "compose",
    "deploy",
    "docs",
    "examples",
    "nvmlsim",
    "proto",
    "receiver",
    "scripts",
    "src",
    "tests",
)
# Folders of their own inside the repository: paths in their files may be relative to them.
DISTRIBUTIONS = {"nvmlsim": ("nvmlsim", "nvmlsim/src"), "collector": ("collector",)}
HASH_COMMENTS = {".sh", ".yaml", ".yml", ".toml", ".txt", ""}
SLASH_COMMENTS = {".go", ".proto"}

LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH = re.compile(r"(?<![\w./@:-])((?:" + "|".join(TOP_DIRS) + r")/[\w./*-]*)")
MD_NAME = re.compile(r"(?<![\w/.:<>-])([\w./-]*[\w-]\.md)\b")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def text_files() -> Iterator[Path]:
    """Every text file of the repository (environments, caches and generated output left out)."""
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.startswith(".venv") for part in rel.parts[:-1]):
            continue
        if any(part.endswith(".egg-info") for part in rel.parts):
            continue
        if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name == "Dockerfile"):
            if "_pb2" not in path.name:
                yield path


FILES = list(text_files())


def ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def bases(citing: Path, cited: str) -> list[Path]:
    """Folders a path cited in ``citing`` may be relative to."""
    out = [citing.parent, ROOT]
    out += [ROOT / d for d in DISTRIBUTIONS.get(citing.relative_to(ROOT).parts[0], ())]
    if "/" not in cited:
        out.append(ROOT / "docs")
    return out


@cache
def ignored(path: str) -> bool:
    """Whether git ignores ``path`` (as a file or a folder) in this repository."""
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "check-ignore", "--no-index", path, path + "/"],
            capture_output=True,
            timeout=30,
        )
    except OSError:  # no git: only existing paths count
        return False
    return done.returncode == 0


def inside(path: Path) -> bool:
    """Whether ``path`` is the repository or in it (``..`` resolved: a folder beside it is not)."""
    resolved = path.resolve()
    return resolved == ROOT or ROOT in resolved.parents


def exists(citing: Path, cited: str) -> bool:
    cited = cited.rstrip(".,;:")
    for base in bases(citing, cited):
        if "*" in cited:
            if any(inside(p) for p in base.glob(cited)):
                return True
        elif inside(base / cited) and (base / cited).exists():
            return True
    return "/" in cited and inside(ROOT / cited) and ignored(cited.rstrip("/"))


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of the prose of ``path``: docstrings and comments, or all of it."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".md":
        yield from enumerate(text.splitlines(), 1)
    elif path.suffix in (".py", ".pyi"):
        tokens = tokenize.generate_tokens(io.StringIO(text).readline)
        yield from ((t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT)
        for node in ast.walk(ast.parse(text)):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
                doc = body[0].value
                if isinstance(doc, ast.Constant) and isinstance(doc.value, str):
                    for n, line in enumerate(doc.value.splitlines()):
                        yield doc.lineno + n, line
    else:
        marker = "//" if path.suffix in SLASH_COMMENTS else "#"
        for n, line in enumerate(text.splitlines(), 1):
            at = line.find(marker)
            if at == 0 or (at > 0 and line[at - 1] in " \t"):
                yield n, line[at:]


@cache
def anchors(markdown: Path) -> frozenset[str]:
    """GitHub's heading anchors of a Markdown file: lower case, punctuation out, spaces to -."""
    text = re.sub(r"```.*?```", "", markdown.read_text(encoding="utf-8"), flags=re.S)
    found = set()
    for heading in HEADING.findall(text):
        plain = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
        found.add(re.sub(r"[^\w\- ]", "", plain).replace(" ", "-"))
    return frozenset(found)


def broken_links(md: Path) -> list[str]:
    problems = []
    text = re.sub(r"```.*?```", "", md.read_text(encoding="utf-8"), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not inside(dest):
            problems.append(f"{target}: outside the repository")
        elif not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    return problems


def missing_citations(path: Path) -> list[str]:
    problems = []
    for n, line in prose(path):
        line = re.sub(r"\[[^\]]*\]\(https?://[^)]*\)|https?://\S+", "", line)
        for cited in PATH.findall(line) + MD_NAME.findall(line):
            if any(c in cited for c in "<{$") or "..." in cited:
                continue
            if not exists(path, cited) and f"line {n}: {cited}" not in problems:
                problems.append(f"line {n}: {cited}")
    return problems


MARKDOWN = [p for p in FILES if p.suffix == ".md"]


@pytest.mark.parametrize("md", MARKDOWN, ids=ids(MARKDOWN))
def test_markdown_links_resolve(md: Path) -> None:
    assert broken_links(md) == []


@pytest.mark.parametrize("path", FILES, ids=ids(FILES))
def test_cited_paths_exist(path: Path) -> None:
    assert missing_citations(path) == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    doc = ROOT / "docs" / "architecture.md"  # any real file: citations are resolved from it
    assert exists(doc, "docs/protocol.md") and exists(doc, "proto/gpumetrics/v1/*.proto")
    assert not exists(doc, "docs/no-such-page.md")
    assert MD_NAME.findall("the rules (``nvml-field-cases.md`` F16)") == ["nvml-field-cases.md"]
    assert PATH.findall("see shared/reference/nvml.md and ../shared/x") == []  # not ours...
    assert not exists(doc, "../shared/reference/")
    assert MD_NAME.findall("see shared/reference/nvml.md") == ["shared/reference/nvml.md"]
    assert not exists(doc, "shared/reference/nvml.md")  # ...but caught as a missing .md
    assert "architecture-and-module-contracts" in anchors(doc) and "layers" in anchors(doc)
    assert exists(doc, "benchmarks/results/") and not exists(doc, "benchmarks/nothing/")
    snippet = tmp_path / "x.py"
    snippet.write_text('"""Doc: ``a.md``."""\n# note: b.md\nc = "c.md"\n')
    assert [line for _, line in prose(snippet)] == ["# note: b.md", "Doc: ``a.md``."]
    assert FILES and MARKDOWN and len(FILES) > 200
