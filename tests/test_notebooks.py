"""Every notebook in ``notebooks/`` runs top to bottom, each as its own test.

The notebooks execute in a fresh IPython kernel (nbclient) in a temporary
working directory; a cell that raises fails the test with the cell and its
traceback. Run one with ``python -m pytest tests/test_notebooks.py -k quickstart``. The pipeline
notebook compiles for minutes on 2 cores: it runs in the slow suite (``-m slow``).
(``python -m pytest --nbmake notebooks/`` runs them through nbmake instead.)
"""

import json
import os
import time
from pathlib import Path

import jax
import pytest

nbclient = pytest.importorskip("nbclient", reason="the notebooks run in nbclient, which is not installed "
                               "(pip install -e '.[test]')")
nbformat = pytest.importorskip("nbformat", reason="the notebooks are read with nbformat, which is not installed")

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 300  # a hung cell fails instead of stalling CI; the notebooks take well under 2 minutes
# The pipeline notebook puts a stage on each of 4 devices: 8 host CPUs it asks XLA for itself, or
# the accelerators. Where the accelerator backend has fewer, its kernel runs on the CPU instead.
DEVICES_NEEDED = {"06_pipeline_parallel": 4}


def _kernel_env(path: Path) -> dict:
    """The kernel's environment: this process's, on the CPU backend where the accelerators are too few."""
    if jax.default_backend() != "cpu" and jax.device_count() < DEVICES_NEEDED.get(path.stem, 1):
        return {"env": dict(os.environ, JAX_PLATFORMS="cpu")}
    return {}


def test_notebooks_exist():
    assert {p.name[:2] for p in NOTEBOOKS} >= {"01", "02", "03", "04", "05"}, NOTEBOOKS


#: Notebooks whose run compiles for minutes on 2 cores: in the slow suite.
SLOW = {"06_pipeline_parallel"}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW else p for p in NOTEBOOKS],
                         ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    start = time.perf_counter()
    client.execute(**_kernel_env(path))  # raises CellExecutionError, naming the cell, if any cell errors
    print(f"{path.name}: {time.perf_counter() - start:.1f} s")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stripped(path):
    """Outputs are not committed: the notebooks in git hold code and prose only."""
    raw = json.loads(path.read_text())
    for cell in raw["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, cell["source"][:1]
