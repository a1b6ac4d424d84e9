"""The documentation: every example runs, names only public API, and the site builds.

Code blocks
-----------
Every fenced ``python`` block of a page under ``docs/`` runs in the default
suite: the blocks of one page in order, in one namespace, in a fresh temporary
working folder, as a reader pasting them into one session would (the README's
blocks run in ``tests/test_readme.py``). The fence's info string may carry
options after the language:

``devices=N``
    the page needs N devices (a mesh). Its blocks run in this process when it
    has N devices (``tests/conftest.py`` gives the suite 8 CPU devices), else in
    a fresh process on the CPU with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``.
    One such block marks the whole page.
``file=NAME``
    the block is a file the page's commands use (a module for ``jaxaot
    inspect``, say): it is written to ``NAME`` in the working folder before the
    page's blocks run, and not run itself.
``processes=N``
    the block is a program of its own (``train.py``), run as N processes at
    once with ``RANK`` (0 to N-1) and ``COORDINATOR`` (``localhost:PORT``) set,
    outside the page's namespace.

A block that is not meant to run uses another language: ``bash`` for shell
commands, ``text`` for printed output or an interactive session. The pages
run in about a minute on 2 CPU cores: an example that compiles for long is
made smaller, not skipped.

Public names
------------
The pages, the README and the notebooks name only public API: nothing under
``jaxaot._src`` (``docs/architecture.md`` alone shows the source layout, by
path), and every dotted ``jaxaot.X.Y`` resolves to an attribute of a public face
(a name in its ``__all__``, then attributes of that object).

The site
--------
Both Sphinx builds are ``slow`` tests (``python -m pytest -m slow tests/test_docs.py``),
left out of the default suite to keep it within its time: one without executing
the notebooks (``JAXAOT_DOCS_EXECUTE=off``; ``tests/test_notebooks.py`` runs
them already), one with the notebooks executed. The table of contents and the
API reference's list of modules are checked in the default suite.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest
from zoo import child_env, free_port, run_processes

import jaxaot

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
HAVE_TOOLCHAIN = all(importlib.util.find_spec(m) for m in ("sphinx", "myst_nb", "furo"))
needs_toolchain = pytest.mark.skipif(not HAVE_TOOLCHAIN, reason="the docs extra is not installed "
                                     "(pip install -e '.[docs]')")
SKIP_PARTS = {"_build", "generated", "_templates"}
PAGES = sorted(p for p in DOCS.rglob("*.md") if not SKIP_PARTS & set(p.relative_to(DOCS).parts))
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w{}-]*)(?P<info>[^\n`]*)\n(?P<code>.*?)^(?P=indent)```[ \t]*$",
                   re.S | re.M)
PROGRAM_TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of a page: its code, its fence's options and its first line's number."""

    code: str
    options: dict
    line: int


def python_blocks(text: str) -> list[Block]:
    """The page's ``python`` blocks in order, dedented, with the ``key=value`` options of their fence."""
    out = []
    for m in FENCE.finditer(text):
        if m.group("lang") != "python":
            continue
        options = dict(word.split("=", 1) for word in m.group("info").split())
        code = textwrap.dedent("".join(line[len(m.group("indent")):] if line.startswith(m.group("indent"))
                                       else line for line in m.group("code").splitlines(keepends=True)))
        out.append(Block(code, options, text.count("\n", 0, m.start()) + 2))
    return out


def test_blocks_are_found_with_their_options():
    text = "x\n```python\na = 1\n```\n\n  ```python devices=8\n  b = a\n  ```\n```bash\nls\n```\n"
    blocks = python_blocks(text)
    assert [(b.code, b.options, b.line) for b in blocks] == [("a = 1\n", {}, 3), ("b = a\n", {"devices": "8"}, 7)]


PAGES_WITH_CODE = [p for p in PAGES if python_blocks(p.read_text())]


def _run_here(page: Path, blocks: list[Block]) -> None:
    """Run the blocks in this process, in one namespace; restore the settings a page may change."""
    namespace: dict = {"__name__": "__main__"}
    jaxaot_logger, root = logging.getLogger("jaxaot"), logging.getLogger()
    saved = (jaxaot_logger.level, root.level, list(root.handlers))
    try:
        with jaxaot.config.override(cache_dir=jaxaot.config.cache_dir):
            for b in blocks:  # compiled at the page's line numbers: tracebacks and source lines point into it
                exec(compile("\n" * (b.line - 1) + b.code, str(page), "exec"), namespace)  # noqa: S102
    finally:
        jaxaot_logger.setLevel(saved[0])
        root.setLevel(saved[1])
        root.handlers[:] = saved[2]
        if "matplotlib.pyplot" in sys.modules:
            sys.modules["matplotlib.pyplot"].close("all")


def _run_fresh(page: Path, blocks: list[Block], devices: int, cwd: Path) -> None:
    """Run the blocks in one fresh Python on ``devices`` CPU devices, in one namespace."""
    runner = cwd / "_page_blocks.py"
    runner.write_text("namespace = {'__name__': '__main__'}\n" + "".join(
        f"exec(compile({chr(10) * (b.line - 1) + b.code!r}, {str(page)!r}, 'exec'), namespace)\n" for b in blocks))
    env = dict(child_env(), JAX_PLATFORMS="cpu", MPLBACKEND="Agg",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    r = subprocess.run([sys.executable, str(runner)], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=PROGRAM_TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-4000:]


def _run_program(page: Path, block: Block, processes: int, cwd: Path) -> None:
    """Run one block as a program of ``processes`` processes at once (RANK, COORDINATOR set)."""
    program = cwd / "train.py"
    program.write_text(block.code)
    env = dict(child_env(), JAX_PLATFORMS="cpu", COORDINATOR=f"localhost:{free_port()}")
    env.pop("XLA_FLAGS", None)
    env.pop("JAXAOT_CACHE_DIR", None)  # each process compiles for itself
    run_processes([[sys.executable, str(program)]] * processes, cwd, [dict(env, RANK=str(i)) for i in range(processes)],
                  PROGRAM_TIMEOUT_S)


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda p: str(p.relative_to(DOCS).with_suffix("")))
def test_the_pages_code_blocks_run(page, tmp_path, monkeypatch):
    blocks = python_blocks(page.read_text())
    unknown = {k for b in blocks for k in b.options} - {"devices", "file", "processes"}
    assert not unknown, f"{page.name}: unknown code block options {unknown} (see this file's docstring)"
    programs = [b for b in blocks if "processes" in b.options]
    session = [b for b in blocks if not {"file", "processes"} & set(b.options)]
    devices = max((int(b.options.get("devices", 1)) for b in session), default=1)
    monkeypatch.chdir(tmp_path)
    for b in blocks:
        if "file" in b.options:
            (tmp_path / b.options["file"]).write_text(b.code)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONPATH", child_env()["PYTHONPATH"])  # a Python the page starts finds this jaxaot
    if session and jax.device_count() >= devices:
        _run_here(page, session)
    elif session:
        _run_fresh(page, session, devices, tmp_path)
    for block in programs:
        _run_program(page, block, int(block.options["processes"]), tmp_path)


# --- public names only

PRIVATE = re.compile(r"jaxaot\._src\b")
SOURCE_PATH = re.compile(r"jaxaot/_src\b")
DOTTED = re.compile(r"\bjaxaot(?:\.[A-Za-z_]\w*)+")
LAYOUT_PAGE = DOCS / "architecture.md"


def _texts() -> dict[Path, str]:
    """The pages, the README, the API reference's index and the notebooks' cells (code and prose)."""
    out = {p: p.read_text() for p in [ROOT / "README.md", *PAGES, *sorted((DOCS / "api").glob("*.rst"))]}
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        out[nb] = "\n".join("".join(cell["source"]) for cell in json.loads(nb.read_text())["cells"])
    return out


def _public(obj, name: str) -> bool:
    """Whether ``name`` is public on ``obj``: in a module's ``__all__`` (its public names where it has none),
    else any attribute not starting with an underscore."""
    if inspect.ismodule(obj):
        names = getattr(obj, "__all__", None)
        if names is None:
            names = [n for n, v in vars(obj).items() if not n.startswith("_") and not inspect.ismodule(v)
                     and getattr(v, "__module__", obj.__name__) == obj.__name__]
        return name in names
    return not name.startswith("_") and hasattr(obj, name)


def unresolved(dotted: str) -> str | None:
    """The first part of ``jaxaot.X.Y...`` that is not a public attribute of what precedes it, else None."""
    obj = jaxaot
    for part in dotted.split(".")[1:]:
        if not _public(obj, part):
            return part
        obj = getattr(obj, part)
    return None


def test_the_name_check_catches_private_and_unknown_names():
    assert unresolved("jaxaot.partition.min_cut_rematerialization_partition") is None
    assert unresolved("jaxaot.parallel.Schedule.validate") is None
    assert unresolved("jaxaot.errors.LoopOverflowError") is None
    assert unresolved("jaxaot.config.cache_dir") is None
    assert unresolved("jaxaot.while_loop") == "while_loop"  # an old home, deprecated: not public
    assert unresolved("jaxaot.loops.no_such_name") == "no_such_name"
    assert unresolved("jaxaot.errors.annotations") == "annotations"
    assert PRIVATE.search("see `jaxaot._src.viz.render`") and not PRIVATE.search("jax._src.debugging")


def test_docs_name_only_public_api():
    bad = []
    for path, text in _texts().items():
        rel = path.relative_to(ROOT)
        for n, line in enumerate(text.splitlines(), 1):
            if PRIVATE.search(line) or (path != LAYOUT_PAGE and SOURCE_PATH.search(line)):
                bad.append(f"{rel}:{n}: private name or path: {line.strip()[:100]}")
            for m in DOTTED.finditer(line):
                part = unresolved(m.group())
                if part is not None and not PRIVATE.match(m.group()):
                    bad.append(f"{rel}:{n}: {m.group()}: {part!r} is not public")
    assert not bad, "docs must name public API only (the faces' __all__):\n" + "\n".join(bad[:60])


def test_the_api_reference_lists_the_public_modules():
    index = (DOCS / "api" / "index.rst").read_text()
    listed = re.findall(r"^   (jaxaot[\w.]*)\s*$", index.split(".. autosummary::", 1)[1], flags=re.M)
    faces = ["jaxaot"] + [f"jaxaot.{n}" for n in jaxaot.__all__
                          if getattr(getattr(jaxaot, n), "__name__", "") == f"jaxaot.{n}"]
    assert sorted(listed) == sorted(faces), listed


# --- the site

def _build(out: Path, execute: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAXAOT_DOCS_EXECUTE": execute}
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-d", str(out / "doctrees"),
           str(DOCS), str(out / "html")]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)


@needs_toolchain
@pytest.mark.slow
def test_docs_build_without_warnings(tmp_path):
    r = _build(tmp_path, "off")
    assert r.returncode == 0, r.stderr[-6000:]
    html = tmp_path / "html"
    for page in ("index", "getting_started", "cli", "caching", "errors", "architecture", "benchmarks", "guarantees",
                 "visualization", "security", "concepts/partitions", "concepts/memory_planner",
                 "concepts/loops", "concepts/export", "concepts/modules", "concepts/sharding",
                 "concepts/compiled_autograd", "notebooks/01_quickstart", "notebooks/05_flax_training",
                 "api/generated/jaxaot"):
        assert (html / f"{page}.html").exists(), page
    api = (html / "api/generated/jaxaot.html").read_text()
    missing = [n for n in jaxaot.__all__ if f"jaxaot.{n}" not in api and f'<span class="pre">{n}</span>' not in api]
    assert not missing, f"public names missing from the API reference: {missing}"
    # Each public function and class has its own page, with its docstring's first line.
    aot_function = (html / "api/generated/jaxaot.aot_function.html").read_text()
    assert "aot_function" in aot_function and "partition_fn" in aot_function


def test_every_glossary_link_names_a_term():
    glossary = (DOCS / "glossary.md").read_text()
    terms = set(re.findall(r"^(\S[^\n]*)$", glossary.split("```{glossary}", 1)[1].split("```", 1)[0], flags=re.M))
    links = {(p.name, m.group(2) or m.group(1)) for p in PAGES
             for m in re.finditer(r"\{term\}`([^`<]+?)(?:\s*<([^>]+)>)?`", p.read_text())}
    assert len(links) >= 10 and len(terms) >= 30, (len(links), len(terms))
    missing = sorted((page, t) for page, t in links if t.strip() not in terms)
    assert not missing, f"glossary links to words it does not define: {missing}"


def test_every_page_is_in_the_table_of_contents():
    index = (DOCS / "index.md").read_text()
    pages = sorted(str(p.relative_to(DOCS).with_suffix("")) for p in DOCS.rglob("*.md")
                   if "_build" not in p.parts and "generated" not in p.parts)
    listed = set(re.findall(r"^([\w/]+)$", index, flags=re.M))
    assert set(pages) - {"index"} <= listed, set(pages) - {"index"} - listed
    notebooks = sorted(p.stem for p in (DOCS.parent / "notebooks").glob("*.ipynb"))
    assert all(f"notebooks/{nb}" in listed for nb in notebooks)


@needs_toolchain
@pytest.mark.slow
def test_docs_build_with_executed_notebooks(tmp_path):
    r = _build(tmp_path, "force")
    assert r.returncode == 0, r.stderr[-6000:]
    page = (tmp_path / "html/notebooks/01_quickstart.html").read_text()
    assert "<svg" in page or "<img" in page  # the picture of the split came out of the executed notebook
