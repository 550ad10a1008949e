"""scripts/check-tracked-files.sh: no build output and no file over 4 MiB outside the allow-list.

The check runs on throwaway git repositories (real ``git``), and once on this repository, which
once tracked a 29 MB compiled Go test binary (``collector/gpumetricsexporter.test``).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check-tracked-files.sh"
MiB = 1024 * 1024

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        timeout=60,
    )


def check(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), str(repo)], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "README.md").write_text("hello\n")
    git(tmp_path, "add", "README.md")
    return tmp_path


def test_a_small_text_tree_passes(repo: Path) -> None:
    done = check(repo)
    assert done.returncode == 0, done.stderr


def test_a_file_over_4_mib_fails_naming_it_until_it_is_allowed(repo: Path) -> None:
    data = repo / "tests" / "big.json"
    data.parent.mkdir()
    data.write_bytes(b"[" + b"0," * (2 * MiB + 1) + b"0]")
    git(repo, "add", "tests/big.json")
    done = check(repo)
    assert done.returncode == 1
    assert "tests/big.json is" in done.stderr and "over 4 MiB" in done.stderr
    (repo / "scripts" / "large-files.allow").write_text(
        "# test data\ntests/big.json   # a recorded answer, needed whole\n"
    )
    assert check(repo).returncode == 0


def test_exactly_4_mib_is_allowed(repo: Path) -> None:
    (repo / "edge.bin.txt").write_bytes(b"a" * (4 * MiB))
    git(repo, "add", "edge.bin.txt")
    assert check(repo).returncode == 0


def test_a_compiled_binary_fails_whatever_its_size_even_when_allowed(repo: Path) -> None:
    # The first bytes of an ELF executable; a tiny one is still a build output.
    (repo / "gpumetricsexporter.test").write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 100)
    git(repo, "add", "gpumetricsexporter.test")
    (repo / "scripts" / "large-files.allow").write_text("gpumetricsexporter.test\n")
    done = check(repo)
    assert done.returncode == 1
    assert "gpumetricsexporter.test is an executable binary" in done.stderr


def test_the_index_counts_not_the_work_tree(repo: Path) -> None:
    big = repo / "big.txt"
    big.write_bytes(b"x" * (5 * MiB))
    git(repo, "add", "big.txt")
    big.write_text("small now, but the index still holds 5 MiB\n")
    assert check(repo).returncode == 1


def test_this_repository_tracks_no_build_output() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = check(ROOT)
    assert done.returncode == 0, done.stderr


def test_go_test_binaries_are_ignored() -> None:
    done = subprocess.run(
        ["git", "check-ignore", "-q", "collector/gpumetricsexporter.test"],
        cwd=ROOT,
        capture_output=True,
        timeout=30,
        check=False,
    )
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert done.returncode == 0, "collector/*.test is not ignored by .gitignore"
