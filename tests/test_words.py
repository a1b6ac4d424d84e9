"""The project speaks of what the code does, not of when it was written.

History lives in git. No file name or file content under the project's folders
(or the README) carries a work-period, goal or tracker label: a label word
directly followed by a number, as in the pattern below.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("jaxaot", "docs", "notebooks", "tests", "benchmarks")
LABEL = re.compile(r"\b(session|goal|issue)[ _-]?#?[0-9]", re.IGNORECASE)
SKIP_PARTS = {"__pycache__", "_build", "generated", ".ipynb_checkpoints", ".pytest_cache", ".hypothesis"}
BINARY = {".png", ".jpg", ".jpeg", ".gif", ".pdf", ".pyc", ".so", ".npz", ".npy", ".bin"}


def _files() -> list[Path]:
    out = [ROOT / "README.md"]
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and not path.is_symlink() and not SKIP_PARTS & set(path.parts):
                out.append(path)
    return out


FILES = _files()


def test_the_pattern_catches_labels():
    joined = " ".join(["Sess" + "ion 13", "go" + "al-2", "Iss" + "ue #16", "iss" + "ue_5"])
    assert len(LABEL.findall(joined)) == 4
    assert not LABEL.findall("the issue block (16 heads), a goal of 2 ms, session-wide settings")


def test_no_labels_in_file_names():
    named = [str(p.relative_to(ROOT)) for p in FILES if LABEL.search(str(p.relative_to(ROOT)))]
    assert not named, f"file names with work-period or tracker labels: {named}"


@pytest.mark.parametrize("folder", ("README.md",) + FOLDERS)
def test_no_labels_in_file_contents(folder):
    hits = []
    for path in FILES:
        rel = path.relative_to(ROOT)
        if rel.parts[0] != folder or path.suffix in BINARY:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError):  # binary, or a file another test removed meanwhile
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if LABEL.search(line):
                hits.append(f"{rel}:{n}: {line.strip()[:100]}")
    assert not hits, "work-period or tracker labels; describe what the code does instead:\n" + "\n".join(hits[:40])
