"""The package's shape: imports run one way down the pipeline, with no cycles, and modules stay small.

The import graph is read from the source (``ast``), so these tests see every
module-level import, including ones a test run would not execute.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from scipy.sparse import csr_array
from scipy.sparse.csgraph import connected_components

import jaxaot

ROOT = Path(jaxaot.__file__).resolve().parent

#: The layers, lowest first. A module may import its own layer (acyclically) and those below.
LAYERS = [
    {"jaxaot.errors", "jaxaot._config", "jaxaot._compat", "jaxaot._pytrees", "jaxaot._files"},
    {"jaxaot.loops"},        # the while-loop primitives: JAX-level, below every stage
    {"jaxaot.tracing"},      # stage 1
    {"jaxaot.partition"},    # stage 2
    {"jaxaot.compile"},      # stage 3
    {"jaxaot.runtime"},      # stage 4
    {"jaxaot.artifacts", "jaxaot.nn", "jaxaot.autograd", "jaxaot.parallel"},  # front-ends on the runtime
    {"jaxaot.viz"},          # pictures of what the runtime built
    {"jaxaot.cli", "jaxaot"},  # the command, and the package face
]

#: Imports deliberately deferred into a function, each for a reason its code states.
DEFERRED = {
    ("jaxaot.runtime.lowered", "jaxaot.viz"),  # Jupyter's view: viz sits above the runtime
    ("jaxaot.runtime.residual_table", "jaxaot.viz"),  # likewise, for the residual table alone
    ("jaxaot.cli.main", "jaxaot.cli.commands"),  # deferred: --help must not import jax
}

#: Optional dependencies that may only be imported inside functions (they are extras).
OPTIONAL = {"graphviz", "matplotlib", "flatbuffers", "flax", "IPython"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The jaxaot module ``name`` refers to (a submodule, or the module holding an attribute)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> list[tuple[str, bool]]:
    """``(imported jaxaot module, at module level)`` pairs of ``module``."""
    tree = ast.parse(MODULES[module].read_text())
    top_level = {id(n) for n in tree.body} | {
        id(n) for stmt in tree.body if isinstance(stmt, (ast.If, ast.Try)) for n in ast.walk(stmt)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "jaxaot":
                target = _resolve(name)
                if target and target != module:
                    out.append((target, id(node) in top_level))
            elif name.split(".")[0] in OPTIONAL:
                out.append((name.split(".")[0], id(node) in top_level))
    return out


def _layer(module: str) -> int:
    for rank, layer in enumerate(LAYERS):
        for prefix in layer:
            if module == prefix or (prefix != "jaxaot" and module.startswith(prefix + ".")):
                return rank
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def test_every_module_has_a_layer():
    for m in MODULES:
        _layer(m)


def test_no_import_cycles():
    names = sorted(MODULES)
    index = {m: i for i, m in enumerate(names)}
    rows, cols = [], []
    for m in names:
        for target, _ in _imports(m):
            # A deferred import (above) runs only when called, after every module has loaded.
            if target in index and target != "jaxaot" and (m, target) not in DEFERRED:
                rows.append(index[m])
                cols.append(index[target])
    graph = csr_array((np.ones(len(rows)), (rows, cols)), shape=(len(names), len(names)))
    n, labels = connected_components(graph, directed=True, connection="strong")
    cycles = [sorted(names[i] for i in np.flatnonzero(labels == c)) for c in range(n) if np.sum(labels == c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def test_imports_run_down_the_pipeline():
    upward = [(m, t) for m in MODULES for t, top in _imports(m)
              if t in MODULES and t != "jaxaot" and _layer(t) > _layer(m) and (m, t) not in DEFERRED]
    assert not upward, f"modules importing a later stage: {upward}"


def test_imports_inside_functions_only_defer_optional_dependencies():
    deferred = [(m, t) for m in MODULES for t, top in _imports(m)
                if not top and t not in OPTIONAL and (m, t) not in DEFERRED]
    assert not deferred, f"imports inside functions: {deferred}"
    eager = [(m, t) for m in MODULES for t, top in _imports(m)
             if top and t in OPTIONAL and not m.startswith("jaxaot.nn")]
    assert not eager, f"optional dependencies imported at module level: {eager}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_hold_one_concept(module):
    lines = MODULES[module].read_text().count("\n")
    assert lines <= 450, f"{module} has {lines} lines: split it by concept"
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            size = node.end_lineno - node.lineno + 1
            assert size <= 220, f"class {module}.{node.name} has {size} lines"


def test_internal_jax_apis_only_in_compat():
    offenders = []
    for m, path in MODULES.items():
        if m == "jaxaot._compat" or m.startswith("jaxaot._compat."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            if any(n.startswith(("jax._src", "jax.extend", "jax.interpreters")) for n in names):
                offenders.append(m)
    assert not offenders, f"jax internals outside _compat: {offenders}"
