"""The repository root's .dockerignore, read for the build context both Dockerfiles use (the
repository root): no file that a Dockerfile COPYs from the context is excluded, and what must
stay out of the context (environments, build output, caches, .git) is.

The patterns are read with Docker's rules in a simple form (moby/patternmatcher, as documented
for .dockerignore): each is cleaned like a path and anchored at the context root; ``*`` and
``?`` stay within one path element, ``**`` spans any number of them (``**/`` also none); a
pattern that matches a directory excludes everything below it; ``!`` re-includes, and the last
pattern that matches a path decides. Syntax beyond that (character classes, escapes) fails the
test instead of being misread. Likewise COPY is read only in its plain shell form.
"""

from __future__ import annotations

import posixpath
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERIGNORE = REPO / ".dockerignore"
DOCKERFILES = (REPO / "Dockerfile", REPO / "collector" / "Dockerfile")

Rule = tuple[bool, re.Pattern[str]]  # (re-includes, what it matches)


def glob_regex(pattern: str) -> str:
    """A regular expression for one cleaned .dockerignore pattern (``*``, ``?``, ``**``)."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        else:
            out.append({"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i])))
            i += 1
    return "".join(out)


def parse_rules(text: str) -> list[Rule]:
    """The rules of a .dockerignore text, in order (comments and blank lines skipped)."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = line.removeprefix("!").strip()
        assert not set(pattern) & set("[]\\"), (
            f".dockerignore {raw!r}: syntax this test cannot read"
        )
        pattern = posixpath.normpath(pattern.lstrip("/"))
        rules.append((include, re.compile(glob_regex(pattern))))
    return rules


def excluded(path: str, rules: list[Rule]) -> bool:
    """Whether ``path`` (relative to the context root, ``/``-separated) is left out."""
    parts = path.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    result = False
    for include, regex in rules:
        if any(regex.fullmatch(c) for c in candidates):
            result = not include
    return result


def context_copies(dockerfile: Path) -> list[str]:
    """Source paths of every COPY from the build context (not ``--from``) in ``dockerfile``."""
    sources = []
    for line in re.sub(r"\\\n", " ", dockerfile.read_text()).splitlines():
        words = line.split()
        if not words or words[0].upper() != "COPY":
            continue
        flags = [w for w in words[1:] if w.startswith("--")]
        args = [w for w in words[1:] if not w.startswith("--")]
        assert args and not args[0].startswith("["), f"{dockerfile}: {line!r}: JSON form not read"
        if any(f.startswith("--from") for f in flags):
            continue
        for source in args[:-1]:
            assert not set(source) & set("*?["), f"{dockerfile}: {source}: wildcards not read"
            sources.append(posixpath.normpath(source))
    return sources


def tracked_files(source: str) -> list[str]:
    """The files git tracks at or under ``source`` (what a clean checkout's context holds)."""
    done = subprocess.run(
        ["git", "ls-files", "-z", "--", source],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
        check=True,
    )
    return [f for f in done.stdout.split("\0") if f]


@pytest.fixture(scope="module")
def rules() -> list[Rule]:
    return parse_rules(DOCKERIGNORE.read_text())


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_nothing_a_dockerfile_copies_is_excluded(dockerfile: Path, rules: list[Rule]) -> None:
    sources = context_copies(dockerfile)
    assert sources, f"{dockerfile}: no COPY from the build context found"
    for source in sources:
        assert not excluded(source, rules), f"{dockerfile}: COPY {source} is in .dockerignore"
        files = tracked_files(source)
        assert files, f"{dockerfile}: COPY {source}: no such tracked file or directory"
        left_out = [f for f in files if excluded(f, rules)]
        assert not left_out, f"{dockerfile}: COPY {source}: .dockerignore excludes {left_out}"


@pytest.mark.parametrize(
    ("path", "want_excluded"),
    [
        (".git/HEAD", True),
        (".venv/bin/python", True),
        (".venv-3.12/bin/python", True),
        ("benchmarks/.venv-peer/bin/python", True),
        ("collector/_build/otelcol-gpumetrics", True),
        ("receiver/gpumetrics/__pycache__/cli.cpython-311.pyc", True),
        ("receiver/gpumetrics.egg-info/PKG-INFO", True),
        (".pytest_cache/v/cache/nodeids", True),
        (".hypothesis/examples/x", True),
        (".mypy_cache/3.11/x.json", True),
        (".ruff_cache/x", True),
        ("benchmarks/results/run.json", True),
        ("pyproject.toml", False),
        ("README.md", False),
        ("receiver/gpumetrics/cli/__init__.py", False),
        ("examples/gpumetrics.yaml", False),
        ("collector/go.mod", False),
        ("collector/builder-config.yaml", False),
        ("collector/receiver/gpumetricsreceiver/config.go", False),
    ],
)
def test_dockerignore_keeps_local_state_out(
    path: str, want_excluded: bool, rules: list[Rule]
) -> None:
    assert excluded(path, rules) is want_excluded


@pytest.mark.parametrize(
    ("patterns", "path", "want_excluded"),
    [
        ("**/__pycache__", "__pycache__/x.pyc", True),  # **/ matches no directory too
        ("**/__pycache__", "a/b/__pycache__/x.pyc", True),
        ("*.pyc", "a/x.pyc", False),  # anchored at the root; * stays in one element
        ("a/*", "a/b/c", True),  # a match excludes what is below it
        ("/build/", "build/x", True),  # cleaned like a path
        ("build", "collector/build", False),
        (".venv?", ".venv1/x", True),
        ("docs\n!docs/keep.md", "docs/keep.md", False),  # the last match decides
        ("!docs/keep.md\ndocs", "docs/keep.md", True),
    ],
)
def test_pattern_reading(patterns: str, path: str, want_excluded: bool) -> None:
    assert excluded(path, parse_rules(patterns)) is want_excluded
