"""The documentation site builds with Sphinx, warnings as errors, and covers the public API.

Both builds are ``slow`` tests (``python -m pytest -m slow tests/test_docs.py``),
left out of the default suite to keep it within its time: one without executing
the notebooks (``JAXAOT_DOCS_EXECUTE=off``; ``tests/test_notebooks.py`` runs
them already), one with the notebooks executed. The table of contents is
checked in the default suite.
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import jaxaot

DOCS = Path(__file__).resolve().parent.parent / "docs"
HAVE_TOOLCHAIN = all(importlib.util.find_spec(m) for m in ("sphinx", "myst_nb", "furo"))
needs_toolchain = pytest.mark.skipif(not HAVE_TOOLCHAIN, reason="the docs extra is not installed "
                                     "(pip install -e '.[docs]')")


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
