"""The public surface: a small core in ``jaxaot`` and one face per domain, every name explicit, visible to
type checkers, and with one home."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shutil
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest

import jaxaot
from jaxaot._src import deprecations

FACES = ("errors", "partition", "compilers", "loops", "nn", "parallel", "export", "viz", "compiled_autograd")
ROOT = Path(jaxaot.__file__).resolve().parent


def _face(name: str):
    return importlib.import_module(f"jaxaot.{name}")


def test_the_surface_is_small():
    assert len(jaxaot.__all__) <= 45, jaxaot.__all__
    for face in FACES:
        assert len(_face(face).__all__) <= 30, (face, _face(face).__all__)


def test_dir_shows_only_public_names():
    assert dir(jaxaot) == sorted(jaxaot.__all__)


@pytest.mark.parametrize("face", FACES)
def test_every_face_name_is_bound_explicitly(face):
    """``from jaxaot._src.x import a as a`` (or a definition in the face itself): what type checkers
    take as a re-export; and each listed name resolves."""
    tree = ast.parse((ROOT / f"{face}.py").read_text())
    bound = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            bound |= {a.asname for a in node.names if a.asname and (a.asname == a.name or face == "compilers")}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
    module = _face(face)
    assert set(module.__all__) <= bound, sorted(set(module.__all__) - bound)
    assert all(hasattr(module, n) for n in module.__all__)


def test_every_top_level_name_is_visible_to_type_checkers():
    """Each name of ``jaxaot.__all__`` is bound as ``x as x`` under ``TYPE_CHECKING`` (the runtime loads it
    lazily) and resolves."""
    tree = ast.parse((ROOT / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test).endswith("TYPE_CHECKING")
                 and not isinstance(n.test, ast.UnaryOp))
    bound = {a.asname for n in ast.walk(block) if isinstance(n, ast.ImportFrom) for a in n.names
             if a.asname == a.name}
    assert set(jaxaot.__all__) == bound
    assert all(getattr(jaxaot, n) is not None for n in jaxaot.__all__)


def test_each_object_has_one_public_home():
    homes: dict[int, list[str]] = {}
    for face, module in [("jaxaot", jaxaot)] + [(f"jaxaot.{f}", _face(f)) for f in FACES]:
        for name in module.__all__:
            value = getattr(module, name)
            if not isinstance(value, type(jaxaot)):
                homes.setdefault(id(value), []).append(f"{face}.{name}")
    assert not [h for h in homes.values() if len(h) > 1]


def test_old_top_level_names_warn_once_and_resolve_to_their_face():
    for name, face in deprecations.MOVED.items():
        deprecations._WARNED.discard(name)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = getattr(jaxaot, name)
            again = getattr(jaxaot, name)
        assert value is again is getattr(importlib.import_module(face), name)
        assert [w.category for w in caught] == [DeprecationWarning], name
        assert f"{face}.{name}" in str(caught[0].message)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        jaxaot.no_such_name  # noqa: B018


def test_calling_the_export_face_warns_and_exports():
    import jax.numpy as jnp

    f = jaxaot.aot_function(lambda w, x: (x @ w).sum())
    args = (jnp.ones((3, 2)), jnp.ones((4, 3)))
    deprecations._WARNED.discard("export")
    with pytest.warns(DeprecationWarning, match="jaxaot.export.export"):
        exported = jaxaot.export(f, *args)
    assert isinstance(exported, jaxaot.export.ExportedAOT)


MYPY_CONFIG = """[mypy]
ignore_missing_imports = True
follow_imports = silent
[mypy-jax.*,jaxlib.*,flax.*,numpy.*,scipy.*,chex.*,optax.*,orbax.*,ml_dtypes.*]
follow_imports = skip
"""


def _mypy(tmp_path, source: str) -> tuple[list[str], str]:
    """mypy's error lines on ``source`` (jaxaot read from this checkout), and its whole output."""
    (tmp_path / "check.py").write_text(source)
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"), "--no-error-summary",
         "--cache-dir", str(tmp_path / "cache"), str(tmp_path / "check.py")],
        capture_output=True, text=True, cwd=ROOT.parent, timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT.parent)})
    return [line for line in out.stdout.splitlines() if ": error:" in line], out.stdout + out.stderr[-2000:]


@pytest.mark.skipif(shutil.which("mypy") is None and importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (it comes with the [test] extra)")
def test_mypy_resolves_every_public_name(tmp_path):
    lines = ["import jaxaot"] + [f"import jaxaot.{f}" for f in FACES]
    lines += [f"reveal_type(jaxaot.{n})" for n in jaxaot.__all__]
    lines += [f"reveal_type(jaxaot.{f}.{n})" for f in FACES for n in _face(f).__all__]
    lines += ["reveal_type(jaxaot.not_a_public_name)"]  # the check itself: this one must be an error
    errors, out = _mypy(tmp_path, "\n".join(lines) + "\n")
    assert len(errors) == 1 and "not_a_public_name" in errors[0], out[-5000:]
    revealed = [line for line in out.splitlines() if "Revealed type" in line]
    assert len(revealed) == len(lines) - len(FACES) - 1


DOCUMENTED_USAGE = """
import functools
import jax, jax.numpy as jnp, jaxaot
from jaxaot import compilers, partition

def loss(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)

def with_options(closed, avals, donate_argnums=()):  # a compiler of one's own, its parameters named as it likes
    return jax.jit(compilers.as_function(closed), donate_argnums=tuple(donate_argnums)).lower(*avals).compile()

for pf in (partition.min_cut_rematerialization_partition, partition.min_cut_rematerialization_partition(
        memory_budget="1MiB"), functools.partial(partition.min_cut_rematerialization_partition, memory_budget=0.5)):
    jaxaot.aot_function(loss, partition_fn=pf)
step = jaxaot.value_and_grad(jaxaot.aot_function(loss, fw_compiler=with_options))
saved: int = step.lower(1.0, 2.0).saved_bytes
misses: int = step.cache_info().misses + jaxaot.compiled_grad(loss).cache_info().misses
misses += jaxaot.grad(loss).cache_info().misses
jaxaot.config.quiet = True
jaxaot.config.quite = True  # error: a misspelt setting
"""


@pytest.mark.skipif(shutil.which("mypy") is None and importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (it comes with the [test] extra)")
def test_documented_usage_type_checks_and_a_misspelt_setting_does_not(tmp_path):
    errors, out = _mypy(tmp_path, DOCUMENTED_USAGE)
    assert len(errors) == 1 and '"quite"' in errors[0], out[-5000:]


def test_the_package_ships_its_type_marker():
    """PEP 561: without ``py.typed`` a type checker reads an installed jaxaot as untyped (every name ``Any``)."""
    assert (ROOT / "py.typed").is_file()
    assert re.search(r'\[tool\.setuptools\.package-data\]\s*jaxaot = \["py\.typed"\]',
                     (ROOT.parent / "pyproject.toml").read_text())


def test_old_import_paths_resolve_to_the_moved_modules_with_a_warning():
    from jaxaot._src.partition.mincut import knapsack
    from jaxaot._src.runtime import function

    for key in ("jaxaot.runtime", "jaxaot.runtime.function", "jaxaot.partition.mincut", "jaxaot.partition.FlowGraph"):
        deprecations._WARNED.discard(key)
        sys.modules.pop(key, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import jaxaot.runtime.function as old_function
        from jaxaot.partition.mincut import knapsack as old_knapsack
        from jaxaot.partition import FlowGraph
    assert old_function.aot_function is function.aot_function
    assert old_knapsack is knapsack
    assert FlowGraph is importlib.import_module("jaxaot._src.partition").FlowGraph
    assert all(w.category is DeprecationWarning for w in caught) and len(caught) == 4, [str(w.message) for w in caught]
    with pytest.raises(ImportError, match="jaxaot.runtime.no_such_module"):
        importlib.import_module("jaxaot.runtime.no_such_module")
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        jaxaot.partition.no_such_name  # noqa: B018


def _public_objects() -> list[tuple[str, object]]:
    """Every public object by its public name: the core's names and each face's ``__all__``."""
    objects = [(f"jaxaot.{n}", getattr(jaxaot, n)) for n in jaxaot.__all__ if n not in FACES]
    return objects + [(f"jaxaot.{f}.{n}", getattr(_face(f), n)) for f in FACES for n in _face(f).__all__]


def _docstrings(name: str, obj: object):
    """``(name, docstring)`` for ``obj`` and what ``help(obj)`` shows with it: a class's methods and
    properties (inherited ones included, private ones left out), a module's functions and classes, an
    instance's class (``jaxaot.config``). Plain values (a dict of styles) have no docstring of their own."""
    if isinstance(obj, types.ModuleType):
        yield name, obj.__doc__
        for attr, value in vars(obj).items():
            if (not attr.startswith("_") and getattr(value, "__module__", None) == obj.__name__
                    and (inspect.isfunction(value) or inspect.isclass(value))):
                yield from _docstrings(f"{name}.{attr}", value)
        return
    if not (inspect.isclass(obj) or inspect.isroutine(obj)):
        if not type(obj).__module__.startswith("jaxaot"):
            return
        obj = type(obj)
    yield name, obj.__doc__
    if inspect.isclass(obj):
        for attr in dir(obj):
            if attr.startswith("_") and not attr.startswith("__"):
                continue
            member = inspect.getattr_static(obj, attr)
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if isinstance(member, property) or inspect.isfunction(member):
                yield f"{name}.{attr}", member.__doc__


def _public_docstrings() -> list[tuple[str, str]]:
    modules = [("jaxaot", jaxaot)] + [(f"jaxaot.{f}", _face(f)) for f in FACES]
    found = [(name, module.__doc__ or "") for name, module in modules]
    return found + [(n, d) for name, obj in _public_objects() for n, d in _docstrings(name, obj) if d]


def test_the_docstring_walk_reaches_methods_properties_and_the_config():
    names = {name for name, _ in _public_docstrings()}
    assert {"jaxaot.partition.DeviceModel.flop_costs", "jaxaot.nn.Optimizer.cache_info",
            "jaxaot.parallel.Pipeline.__call__", "jaxaot.compiled_autograd.stats", "jaxaot.config"} <= names


def test_public_docstrings_send_readers_only_to_public_names():
    """What ``help()`` shows of a public object names no ``jaxaot._src`` module, function or class: a reader
    is pointed at the public name, or at the page of the docs that explains the concept."""
    offenders = sorted({name for name, doc in _public_docstrings() if "jaxaot._src" in doc})
    assert not offenders, f"docstrings naming jaxaot._src (use the public name or a docs page): {offenders}"


def test_public_docstrings_name_no_missing_or_old_public_names():
    """A ``jaxaot.<name>`` or ``jaxaot.<face>.<name>`` in a public docstring is a public name (or an
    attribute of one): not an internal one of a face, nor an old top-level name such as ``jaxaot.while_loop``."""
    objects = {name for name, _ in _public_objects()}
    allowed = objects | {"jaxaot"} | {f"jaxaot.{f}" for f in FACES}
    offenders = set()
    for name, doc in _public_docstrings():
        for match in re.finditer(r"jaxaot(?:\.\w+)+", doc):
            ref = match.group(0)
            if not (ref.startswith("jaxaot._src") or ref in allowed or any(ref.startswith(o + ".") for o in objects)):
                offenders.add(f"{name}: {ref}")
    assert not offenders, f"docstrings naming what is not public: {sorted(offenders)}"


def _unbound_names(source: str) -> set[str]:
    """Names an example's code reads that it neither imports nor assigns, nor are builtins."""
    tree = ast.parse(source)
    bound = set(dir(__builtins__) if isinstance(__builtins__, types.ModuleType) else __builtins__)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.comprehension):
            bound |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


def test_public_examples_import_what_they_use():
    """A public docstring's example runs as a user would paste it: every name it uses is imported or defined
    in it, not taken from the defining module's globals (which doctest lends it)."""
    import doctest

    def ours(name: str) -> bool:  # a docstring jaxaot wrote (AOTLinenModule inherits Flax's methods)
        obj: object = importlib.import_module("jaxaot")
        for part in name.split(".")[1:]:
            obj = inspect.getattr_static(obj, part, None) if inspect.isclass(obj) else getattr(obj, part, None)
        obj = getattr(obj, "fget", None) or getattr(obj, "__func__", None) or obj
        return (getattr(obj, "__module__", None) or type(obj).__module__).startswith("jaxaot")

    parser = doctest.DocTestParser()
    offenders = {}
    for name, doc in _public_docstrings():
        if not ours(name):
            continue
        examples = parser.get_examples(doc or "")
        if examples:
            unbound = _unbound_names("\n".join(e.source for e in examples))
            if unbound:
                offenders[name] = sorted(unbound)
    assert not offenders, f"examples using names they do not import: {offenders}"


def test_every_error_pickles_with_its_attributes():
    """An error raised in a worker process reaches its parent whole: message, type and attributes."""
    import pickle

    import jax

    device = jax.devices()[-1]
    made = {jaxaot.errors.MemoryBudgetError: dict(budget=7, smallest_peak=9, holders=("a",)),
            jaxaot.errors.PipelineMemoryError: dict(peak=3, limit=2, available=1, device=device)}
    for name in jaxaot.errors.__all__:
        cls = getattr(jaxaot.errors, name)
        err = cls(f"{name} happened", **made.get(cls, {}))
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is cls and str(back) == str(err) and back.__dict__ == err.__dict__, name
    lost = pickle.loads(pickle.dumps(jaxaot.errors.PipelineMemoryError("m", device=types.SimpleNamespace(
        platform="tpu", id=5))))
    assert lost.device == "tpu:5"  # a device this process does not have is named
