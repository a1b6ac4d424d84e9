"""The package's shape: imports run one way down the pipeline, through faces, with no cycles; modules stay small.

The import graph is read from the source (``ast``), so these tests see every
import, at module level or inside a function, including ones a test run would
not execute. Imports under ``if TYPE_CHECKING:`` never run and are left out.
"""

from __future__ import annotations

import ast
import collections
import re
from pathlib import Path

import numpy as np
import pytest
from scipy.sparse import csr_array
from scipy.sparse.csgraph import connected_components

import jaxaot

ROOT = Path(jaxaot.__file__).resolve().parent

#: The public modules: the package and its faces. Everything else is under ``jaxaot._src``.
PUBLIC_FACES = ("jaxaot", "jaxaot.errors", "jaxaot.partition", "jaxaot.compilers", "jaxaot.loops", "jaxaot.nn",
                "jaxaot.parallel", "jaxaot.export", "jaxaot.viz", "jaxaot.compiled_autograd")

#: The layers, lowest first. A module may import its own layer (acyclically) and those below.
LAYERS = [
    {"jaxaot.errors", "jaxaot._src", "jaxaot._src.config", "jaxaot._src.compat", "jaxaot._src.pytrees",
     "jaxaot._src.files", "jaxaot._src.display", "jaxaot._src.progress", "jaxaot._src.deprecations",
     "jaxaot._src.tables", "jaxaot._src.units", "jaxaot._src.workers", "jaxaot._src.allowance",
     "jaxaot._src.module_links", "jaxaot._src.names", "jaxaot._src.python_reads"},
    {"jaxaot._src.loops"},        # the while-loop primitives: JAX-level, below every stage
    {"jaxaot._src.tracing"},      # stage 1
    {"jaxaot._src.partition"},    # stage 2
    {"jaxaot._src.compile"},      # stage 3
    {"jaxaot._src.fusion"},       # the fused step's planning, on the compiled stages
    {"jaxaot._src.runtime"},      # stage 4
    {"jaxaot._src.artifacts", "jaxaot._src.nn", "jaxaot._src.parallel"},  # front-ends on the runtime
    {"jaxaot._src.autograd"},     # eager gradients of aot functions and modules, and compiled autograd
    {"jaxaot._src.compare"},      # jaxaot's training steps measured next to JAX's
    {"jaxaot._src.viz"},          # pictures of what the runtime built
    {*PUBLIC_FACES, "jaxaot.__main__", "jaxaot._src.cli"},  # the public faces, and the command written on them
]

#: Optional dependencies that may only be imported inside functions (they are extras).
OPTIONAL = {"graphviz", "matplotlib", "flatbuffers", "flax", "IPython", "tqdm"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()
FOUNDATION = LAYERS[0]


def _resolve(name: str) -> str | None:
    """The jaxaot module ``name`` refers to (a submodule, or the module holding an attribute)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _face_names(face: str) -> set[str]:
    """The names a package's face binds: ``simulate`` in ``jaxaot._src.parallel`` is the function its face
    imports (``from jaxaot._src.parallel.simulator import simulate``), ``compilers`` in ``jaxaot._src.compile``
    the submodule its face re-exports."""
    out = set()
    for node in ast.parse(MODULES[face].read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return out


def _import_names(node: ast.AST, importer: str) -> list[str]:
    """The dotted names an ``import``, ``from ... import`` or ``importlib.import_module("...")`` brings in.

    ``from jaxaot.<sub> import name`` from another subpackage is an import of the face when the face
    binds ``name`` (it runs the face, whatever ``name`` is); the root package's foundation modules
    (``from jaxaot._src import compat as C``) are themselves.
    """
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        face = node.module
        through_face = (face in MODULES and MODULES[face].name == "__init__.py" and face != "jaxaot"
                        and _package(face) != _package(importer))
        bound = _face_names(face) if through_face else set()
        return [face if a.name in bound else f"{face}.{a.name}" for a in node.names]
    if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
        return [node.args[0].value]
    return []


def _imports(module: str) -> list[tuple[str, bool]]:
    """``(imported jaxaot module or optional dependency, at module level)`` pairs of ``module``."""
    tree = ast.parse(MODULES[module].read_text())
    out = []

    def visit(node: ast.AST, top: bool) -> None:
        if _is_type_checking(node):
            return
        for name in _import_names(node, module):
            root = name.split(".")[0]
            if root == "jaxaot":
                target = _resolve(name)
                if target and target != module:
                    out.append((target, top))
            elif root in OPTIONAL:
                out.append((root, top))
        inner = top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, True)
    return out


def _layer(module: str) -> int:
    for rank, layer in enumerate(LAYERS):
        for prefix in layer:
            if module == prefix or (prefix not in ("jaxaot", "jaxaot._src") and module.startswith(prefix + ".")):
                return rank
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def _package(module: str) -> str:
    """The subpackage (or foundation module) ``module`` belongs to: ``jaxaot._src.<sub>``, or the public
    face ``jaxaot.<face>``."""
    parts = module.split(".")
    return ".".join(parts[:3] if parts[1:2] == ["_src"] else parts[:2])


def _is_face(module: str) -> bool:
    """Whether ``module`` is a package's ``__init__`` (a subpackage's or sub-folder's face)."""
    return MODULES[module].name == "__init__.py"


def _edges() -> list[tuple[str, str, bool]]:
    return [(m, t, top) for m in MODULES for t, top in _imports(m) if t in MODULES]


def test_every_module_has_a_layer():
    for m in MODULES:
        _layer(m)


def test_no_import_cycles():
    """Lazy imports (inside functions) count: they are cycles that only fail later."""
    names = sorted(MODULES)
    index = {m: i for i, m in enumerate(names)}
    pairs = {(index[m], index[t]) for m, t, _ in _edges()}
    rows, cols = zip(*pairs) if pairs else ((), ())
    graph = csr_array((np.ones(len(rows)), (rows, cols)), shape=(len(names), len(names)))
    n, labels = connected_components(graph, directed=True, connection="strong")
    cycles = [sorted(names[i] for i in np.flatnonzero(labels == c)) for c in range(n) if np.sum(labels == c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def test_imports_run_down_the_pipeline():
    upward = sorted({(m, t) for m, t, _ in _edges() if _layer(t) > _layer(m)})
    assert not upward, f"modules importing a later stage: {upward}"


def _on_demand() -> set[str]:
    """Modules loaded only when code needs them: every jaxaot module importing one does so inside a
    function, or is itself loaded on demand (``jaxaot._src.autograd.direct.module``, say, which the gradient
    imports once it is handed an ``aot_module``)."""
    importers: dict[str, list[tuple[str, bool]]] = {m: [] for m in MODULES}
    for m, t, top in _edges():
        importers[t].append((m, top))
    out: set[str] = set()
    changed = True
    while changed:
        changed = False
        for m, by in importers.items():
            if m not in out and by and all(not top or i in out for i, top in by) and not _is_face(m):
                out.add(m)
                changed = True
    return out


def test_imports_inside_functions_stay_in_their_package_or_are_optional():
    """A lazy import is of an optional dependency, or of a module of the importer's own subpackage
    (``jaxaot._src.cli.main`` defers ``jaxaot._src.cli.commands`` so that ``--help`` imports no JAX)."""
    deferred = sorted({(m, t) for m in MODULES for t, top in _imports(m)
                       if not top and t not in OPTIONAL and _package(t) != _package(m) and m not in PUBLIC_FACES})
    assert not deferred, f"imports inside functions: {deferred}"


def test_optional_dependencies_load_only_where_used():
    """Flax, Graphviz, ... are imported at module level only by the Flax front-end (``jaxaot._src.nn``,
    which ``jaxaot`` loads on first use of its names) and by modules loaded on demand; importing
    ``jaxaot._src.nn`` from elsewhere counts as importing Flax."""
    on_demand = _on_demand()
    eager = sorted({(m, t) for m in MODULES for t, top in _imports(m)
                    if top and (t in OPTIONAL or _package(t) == "jaxaot._src.nn")
                    and _package(m) != "jaxaot._src.nn" and m not in on_demand
                    and (m == "jaxaot" or m not in PUBLIC_FACES)})
    assert not eager, f"optional dependencies imported at module level: {eager}"


def test_imports_across_subpackages_go_through_faces():
    """``from jaxaot._src.partition import Partition``, not ``from jaxaot._src.partition.core.split import Partition``:
    another subpackage is imported through its face (``jaxaot.<sub>`` or a sub-folder's ``__init__``);
    foundation modules are imported directly, as themselves."""
    bypass = sorted({(m, t) for m, t, _ in _edges()
                     if _package(t) != _package(m) and t != _package(t) and not _is_face(t)})
    assert not bypass, f"imports past another subpackage's face: {bypass}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_hold_one_concept(module):
    lines = MODULES[module].read_text().count("\n")
    assert lines <= 450, f"{module} has {lines} lines: split it by concept"
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            size = node.end_lineno - node.lineno + 1
            assert size <= 220, f"class {module}.{node.name} has {size} lines"


#: File names several modules under ``jaxaot._src`` may share: a package's face, and modules that
#: mirror each other in parallel packages on purpose (a reader who finds one looks for its twin under
#: the same name). Any other shared name leaves ``placement.py`` or ``api.py`` to say nothing of what
#: a module holds: name the concept instead.
SHARED_FILE_NAMES = frozenset({"__init__.py"})


def test_module_file_names_are_unique():
    by_name = collections.defaultdict(list)
    for module, path in MODULES.items():
        if module.startswith("jaxaot._src.") and path.name not in SHARED_FILE_NAMES:
            by_name[path.name].append(module)
    shared = {name: sorted(mods) for name, mods in by_name.items() if len(mods) > 1}
    assert not shared, f"modules sharing a file name (name each for its concept): {shared}"


#: The longest module docstring, in lines, an ``Example:`` section left out: what the module holds and why.
MAX_DOCSTRING_LINES = 12


def _prose_lines(doc: str) -> list[str]:
    """``doc``'s lines less its ``Example:`` section (that line and the indented block under it)."""
    out, in_example = [], False
    for line in doc.strip("\n").splitlines():
        if re.fullmatch(r"Examples?:\s*", line):
            in_example = True
            continue
        if in_example and line.strip() and not line[0].isspace():
            in_example = False
        if not in_example:
            out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return out


def test_the_line_count_leaves_the_example_out():
    doc = "Summary.\n\nWhy.\n\nExample:\n    >>> 1\n    1\n\nAfter.\n"
    assert _prose_lines(doc) == ["Summary.", "", "Why.", "", "After."]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_docstrings_are_short(module):
    """A module docstring says what the module holds and why in a few lines; the rest belongs to the
    functions and classes, and to the docs."""
    doc = ast.get_docstring(ast.parse(MODULES[module].read_text()), clean=False) or ""
    lines = len(_prose_lines(doc))
    assert lines <= MAX_DOCSTRING_LINES, (f"{module}'s docstring has {lines} lines besides its example: say what "
                                          f"the module holds and why in at most {MAX_DOCSTRING_LINES}")


#: Accelerator models: a measurement taken on one belongs in docs/benchmarks.md, not in the code.
DEVICE_MODELS = re.compile(r"\b(?:H100|H200|A100|V100)\b|\bTPU ?v\d")


def test_no_device_models_in_the_package():
    hits = []
    for path in sorted(ROOT.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        hits += [f"{path.relative_to(ROOT.parent)}:{n}: {line.strip()[:100]}"
                 for n, line in enumerate(text.splitlines(), 1) if DEVICE_MODELS.search(line)]
    assert not hits, "accelerator models named in the package (measurements go to docs/benchmarks.md):\n" + \
        "\n".join(hits[:40])


def test_the_device_model_pattern_catches_them():
    assert len(DEVICE_MODELS.findall("on an H100, an A100, a TPU v5e and a TPU v4")) == 4
    assert not DEVICE_MODELS.findall("TPUs, GPUs, the H matrix, 100 steps")


def test_internal_jax_apis_only_in_compat():
    offenders = []
    for m, path in MODULES.items():
        if m == "jaxaot._src.compat" or m.startswith("jaxaot._src.compat."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            if any(n.startswith(("jax._src", "jax.extend", "jax.interpreters")) for n in names):
                offenders.append(m)
    assert not offenders, f"jax internals outside _compat: {offenders}"


def _compat_uses(tree: ast.AST) -> set[str]:
    """The names a module takes from ``jaxaot._src.compat``: ``C.<name>`` (``C`` however it is bound)
    and ``from jaxaot._src.compat import <name>``."""
    aliases, names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "jaxaot._src":
            aliases |= {a.asname or a.name for a in node.names if a.name == "compat"}
        elif isinstance(node, ast.ImportFrom) and node.module == "jaxaot._src.compat":
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == "jaxaot._src.compat" and a.asname}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            names.add(node.attr)
    return names


def test_compat_exports_what_jaxaot_uses():
    """``jaxaot._src.compat.__all__`` lists every name the rest of jaxaot takes from it, and only names it has."""
    from jaxaot._src import compat as _compat

    exported = set(_compat.__all__)
    assert all(hasattr(_compat, n) for n in exported), sorted(n for n in exported if not hasattr(_compat, n))
    missing = sorted({(m, n) for m, path in MODULES.items() if _package(m) != "jaxaot._src.compat"
                      for n in _compat_uses(ast.parse(path.read_text())) if n not in exported})
    assert not missing, f"names used from jaxaot._src.compat but not in its __all__: {missing}"
