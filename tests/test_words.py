"""The project speaks of what the code does, not of when it was written.

History lives in git. No file name or file content under the project's folders
(or the README) carries a work-period, goal or tracker label: a label word
directly followed by a number, as in the pattern below. The documentation's
prose (the README, the pages, the notebooks' text; code left out) describes
what is, not how it came to be: none of the phrases of ``HISTORY``.
"""

from __future__ import annotations

import json
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


#: Phrases that narrate the project's history rather than describe the present.
HISTORY = re.compile(r"\b(now|nowadays|used to|no longer|any ?more|at first|first (version|attempt)|as before|"
                     r"previously|formerly|originally|until recently|earlier (version|runtime|run)s?|"
                     r"keeps the earlier|did not know|(was|were) (then )?(removed|reverted|added|fixed|counted)|"
                     r"in git history)\b", re.IGNORECASE)


def _prose(path: Path) -> str:
    """The text a reader reads as prose: code blocks and inline code left out (a printed message may say
    ``x is now passed by keyword``); of a notebook, its markdown cells."""
    if path.suffix == ".ipynb":
        text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                         if c["cell_type"] == "markdown")
    else:
        text = path.read_text()
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group().count("\n"), text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "``", text)


def test_the_history_pattern_catches_narration():
    told = ["which the model did not know at first", "it now runs 1.02x", "the planner used to offload",
            "is no longer passed", "a first version computed", "Probes were then removed (see git history)"]
    assert all(HISTORY.search(t) for t in told)
    assert not HISTORY.search("a loop of at most that many steps, known at trace time, before the backward")


def test_docs_describe_the_present():
    pages = [p for p in FILES if p.suffix in (".md", ".ipynb") and p.relative_to(ROOT).parts[0] in
             ("README.md", "docs", "notebooks")]
    hits = []
    for path in pages:
        for n, line in enumerate(_prose(path).splitlines(), 1):
            if HISTORY.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert len(pages) > 10 and not hits, "history in the docs; say what is instead:\n" + "\n".join(hits[:40])
