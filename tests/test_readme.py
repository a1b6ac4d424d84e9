"""The README is a front page that works: its set-up commands and every code block run as written.

The Python blocks run in order, in one fresh interpreter, as a reader pasting them
would. The first set-up command runs in a new virtual environment (with the
system's site packages, so nothing is downloaded but what pip needs to build
jaxaot itself); the second is the test command, which CI runs as ``.ci/run``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from zoo import child_env

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def _setup_commands() -> list[str]:
    install = README.split("## Install", 1)[1]
    block = re.search(r"```bash\n(.*?)```", install, flags=re.S).group(1)
    return [line.split("   #")[0].strip() for line in block.strip().splitlines()]


def test_readme_is_a_front_page():
    lines = README.count("\n")
    assert lines <= 300, f"README.md has {lines} lines: longer material belongs in docs/"
    for title in ("## Install", "## Quickstart", "## Recipes", "## Features", "## Measured results"):
        assert title in README, title


def test_readme_links_resolve():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    missing = [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_readme_python_blocks_run(tmp_path):
    blocks = _blocks("python")
    assert len(blocks) >= 4
    script = tmp_path / "readme_blocks.py"
    script.write_text("\n\n".join(blocks))
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env=child_env())  # jaxaot importable as this checkout's, installed or not
    assert r.returncode == 0, r.stderr[-4000:]
    assert "largest residuals:" in r.stdout and "bytes saved for the backward" in r.stdout


def test_the_test_command_is_what_ci_runs():
    _, test = _setup_commands()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1].strip()
    assert ci == test, f".ci/run runs {ci!r}, the README says {test!r}"


def _build_requirements_fetchable(folder: Path) -> bool:
    """Whether pip can fetch jaxaot's build requirements (pyproject.toml's) from a package index here."""
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder),
                        "setuptools>=68", "wheel"], capture_output=True, text=True, timeout=300)
    return r.returncode == 0


def test_the_first_command_installs_and_runs_the_demo(tmp_path):
    install, _ = _setup_commands()
    assert install.startswith("pip install -e ") and install.endswith("jaxaot demo")
    if not _build_requirements_fetchable(tmp_path / "probe"):
        pytest.skip("no package index reachable: pip cannot fetch setuptools and wheel to build jaxaot")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv),
           "TMPDIR": str(tmp_path), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    r = subprocess.run(["bash", "-c", install], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert "gradients match jax.value_and_grad" in r.stdout, r.stdout[-3000:]
    assert str(venv) in subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
                                       capture_output=True, text=True).stdout


def test_the_smoke_command_selects_a_quick_tour():
    assert "python -m pytest -m smoke" in README
    r = subprocess.run([sys.executable, "-m", "pytest", "-m", "smoke", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "tests"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    selected = [line for line in r.stdout.splitlines() if "::" in line]
    assert r.returncode == 0 and len(selected) >= 8, r.stdout[-3000:]
    folders = {line.split("/")[1] for line in selected if line.startswith("tests/") and line.count("/") > 1}
    assert len(folders) >= 5, f"the smoke tests should tour the features, they cover only {folders}"


@pytest.mark.parametrize("page", ["docs/architecture.md", "docs/concepts/loops.md", "docs/errors.md",
                                  "docs/benchmarks.md"])
def test_the_long_material_lives_in_docs(page):
    assert (ROOT / page).exists(), page
