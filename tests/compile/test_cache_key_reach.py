"""A user's compiler or partitioner is keyed by all the code it runs, not by the callable alone.

Fresh processes share one cache: a writer, a reader of the same code (it hits, and its keys equal the writer's
under another hash seed and from another folder), and a reader whose code differs from the writer's in one place
per case: another method's body, a class attribute, a helper in a module of the user's, a nested function's
body, a partitioner's method. Each such reader misses and computes what a cold process computes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from zoo import child_env

from jaxaot._src.compile import cache_keys, code_reach

#: The user's modules, each ``{DT}``/``{PART}`` filled per variant: "lossy" casts through bfloat16, "exact" not.
MODULES = {
    "comp_method": """
        import dataclasses
        import jax
        import jax.numpy as jnp
        from jaxaot.compilers import as_function

        @dataclasses.dataclass(frozen=True)
        class MethodCompiler:
            def __call__(self, closed, avals, donate_argnums=()):
                return self.build(closed, avals)

            def build(self, closed, avals):  # only this method's body differs
                run = as_function(closed)
                return jax.jit(lambda *a: [o.astype(jnp.{DT}).astype(o.dtype) for o in run(*a)]).lower(*avals).compile()
        """,
    "comp_attr": """
        import dataclasses
        import jax
        import jax.numpy as jnp
        from jaxaot.compilers import as_function

        @dataclasses.dataclass(frozen=True)
        class AttrCompiler:
            DT = jnp.{DT}

            def __call__(self, closed, avals, donate_argnums=()):
                run = as_function(closed)
                return jax.jit(lambda *a: [o.astype(self.DT).astype(o.dtype) for o in run(*a)]).lower(*avals).compile()
        """,
    "helpers_user": """
        import jax.numpy as jnp

        def cast(o):
            return o.astype(jnp.{DT}).astype(o.dtype)
        """,
    "comp_helper": """
        import dataclasses
        import jax
        from jaxaot.compilers import as_function
        import helpers_user

        @dataclasses.dataclass(frozen=True)
        class HelperCompiler:
            def __call__(self, closed, avals, donate_argnums=()):
                run = as_function(closed)
                return jax.jit(lambda *a: [helpers_user.cast(o) for o in run(*a)]).lower(*avals).compile()
        """,
    "comp_nested": """
        import typing
        import jax
        import jax.numpy as jnp
        from jaxaot.compilers import as_function

        class Tag(typing.NamedTuple):  # its methods hold builtins bound to tuple (no address in the key)
            name: str

        class NestedCompiler:  # not a dataclass: keyed by its class and its __dict__
            def __init__(self, tag):
                self.tag = Tag(tag)

            def __call__(self, closed, avals, donate_argnums=()):
                return jax.jit(self.lowered(closed)).lower(*avals).compile()

            def lowered(self, closed):
                run = as_function(closed)

                def cast_all(*a):
                    return [o.astype(jnp.{DT}).astype(o.dtype) for o in run(*a)]

                return cast_all
        """,
    "part_pick": """
        import jaxaot

        class PickPartitioner:
            def __call__(self, joint):
                return self.pick()(joint)

            def pick(self):
                return jaxaot.partition.{PART}
        """,
}
VARIANTS = {"lossy": dict(DT="bfloat16", PART="default_partition"),
            "exact": dict(DT="float32", PART="min_cut_rematerialization_partition")}

CHILD = """
import dataclasses, json
import jax, jax.numpy as jnp, numpy as np
import jaxaot
from jaxaot._src.compile import cache_keys
import comp_attr, comp_helper, comp_method, comp_nested, part_pick

cases = {"method": dict(fw_compiler=comp_method.MethodCompiler()),
         "class_attr": dict(fw_compiler=comp_attr.AttrCompiler()),
         "helper_module": dict(fw_compiler=comp_helper.HelperCompiler()),
         "nested_plain": dict(fw_compiler=comp_nested.NestedCompiler("plain")),
         "partitioner": dict(partition_fn=part_pick.PickPartitioner())}
x = jnp.linspace(0, 1, 7) + 0.123
out = {}
for name, options in cases.items():
    jaxaot.compilers.reset_cache_stats()
    value, grad = jax.value_and_grad(jaxaot.aot_function(lambda x: jnp.sum(jnp.sin(x)), **options))(x)
    out[name] = {"value": float(value), "grad": np.asarray(grad).tolist(),
                 "stats": dataclasses.asdict(jaxaot.compilers.cache_stats()),
                 "identity": cache_keys.callable_identity(next(iter(options.values())))}
print("RESULT" + json.dumps(out))
"""
CASES = ("method", "class_attr", "helper_module", "nested_plain", "partitioner")


def _write(folder, variant):
    folder.mkdir(parents=True)
    for name, text in MODULES.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(text).format(**VARIANTS[variant]))


def _child(folder, cache, seed):
    env = child_env()
    env.update(PYTHONPATH=f"{folder}:{env['PYTHONPATH']}", PYTHONHASHSEED=seed, JAX_PLATFORMS="cpu",
               JAXAOT_CACHE_DIR=str(cache), JAXAOT_CACHE_KEY_FILE=str(cache.parent / "keys" / "key"))
    run = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300,
                         cwd=folder)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads([ln for ln in run.stdout.splitlines() if ln.startswith("RESULT")][-1][len("RESULT"):])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Writer (lossy), a reader of the same code from another folder and hash seed, a reader of the exact code."""
    root = tmp_path_factory.mktemp("reach")
    for folder, variant in (("writer", "lossy"), ("same", "lossy"), ("changed", "exact")):
        _write(root / folder, variant)
    cache = root / "cache"
    return {name: _child(root / name, cache, seed) for name, seed in (("writer", "1"), ("same", "4242"),
                                                                      ("changed", "7"))}


def _exact():
    x = jnp.linspace(0, 1, 7) + 0.123
    value, grad = jax.value_and_grad(lambda x: jnp.sum(jnp.sin(x)))(x)
    return float(value), np.asarray(grad)


@pytest.mark.parametrize("case", CASES)
def test_the_same_code_hits_with_the_same_key(runs, case):
    writer, same = runs["writer"][case], runs["same"][case]
    assert same["identity"] == writer["identity"]
    stats = same["stats"]
    if case == "partitioner":
        assert stats["partition_hits"] == 1 and stats["partition_misses"] == 0, stats
    else:
        assert stats["executable_hits"] >= 1 and stats["executable_misses"] == 0, stats
    assert same["value"] == writer["value"] and same["grad"] == writer["grad"]


@pytest.mark.parametrize("case", CASES)
def test_changed_code_misses_and_computes_what_a_cold_process_does(runs, case):
    writer, changed = runs["writer"][case], runs["changed"][case]
    assert changed["identity"] != writer["identity"]
    stats = changed["stats"]
    value, grad = _exact()
    if case == "partitioner":
        assert stats["partition_misses"] == 1 and stats["partition_hits"] == 0, stats
    else:
        assert stats["executable_hits"] == 0 and stats["executable_misses"] >= 1, stats
        assert writer["value"] != pytest.approx(value, rel=1e-6)  # the writer's executable casts: a hit would show
    np.testing.assert_allclose(changed["value"], value, rtol=1e-6)
    np.testing.assert_allclose(changed["grad"], grad, rtol=1e-6)


# --------------------------------------------------------------------------- in one process
class Plain:
    def __init__(self, gain):
        self.gain = gain

    def __call__(self, closed, avals, donate_argnums=()):
        return self.scale(closed)

    def scale(self, closed):
        return closed


class Child(Plain):
    LIMIT = 3


def test_a_plain_callable_instance_is_its_class_and_fields_not_its_address():
    ident = cache_keys.callable_identity
    assert ident(Plain(1.0)) == ident(Plain(1.0)) and ident(Plain(1.0)) != ident(Plain(2.0))
    assert "0x" not in ident(Plain(1.0))
    assert ident(Child(1.0)) != ident(Plain(1.0))


def test_methods_and_class_attributes_through_the_mro_are_keyed(monkeypatch):
    ident = cache_keys.callable_identity
    base = ident(Child(1.0))
    monkeypatch.setattr(Plain, "scale", lambda self, closed: closed)  # a base class's method
    assert ident(Child(1.0)) != base
    monkeypatch.undo()
    assert ident(Child(1.0)) == base
    monkeypatch.setattr(Child, "LIMIT", 4)
    assert ident(Child(1.0)) != base


def _module(name, source):
    module = types.ModuleType(name)  # made at run time: the user's code
    exec(textwrap.dedent(source), module.__dict__)
    return module


def test_a_module_global_is_followed_by_the_names_the_code_reads(monkeypatch):
    helpers = _module("reach_helpers", """
        SCALE = 2.0
        def build(x):
            return x * SCALE
        def unused(x):
            return x
        """)
    user = _module("reach_user", "def compiler(closed, avals):\n    return helpers.build(closed)\n")
    user.helpers = helpers
    base = cache_keys.callable_identity(user.compiler)
    monkeypatch.setattr(helpers, "SCALE", 3.0)  # read by build, two steps away
    assert cache_keys.callable_identity(user.compiler) != base
    monkeypatch.undo()
    monkeypatch.setattr(helpers, "unused", lambda x: -x)  # not read
    assert cache_keys.callable_identity(user.compiler) == base


def test_a_module_imported_inside_the_function_is_followed(monkeypatch):
    local = _module("reach_local", "def build(x):\n    return x\n")
    monkeypatch.setitem(sys.modules, "reach_local", local)
    user = _module("reach_importer", "def compiler(closed, avals):\n    import reach_local\n"
                                     "    return reach_local.build(closed)\n")
    base = cache_keys.callable_identity(user.compiler)
    monkeypatch.setattr(local, "build", lambda x: -x)
    assert cache_keys.callable_identity(user.compiler) != base


def test_cycles_key_once_and_a_chain_past_the_bound_is_not_cached():
    ping = _module("reach_cycle", """
        class Node:
            def make(self):
                return Node()
        def ping(n):
            return pong(n - 1) if n else Node()
        def pong(n):
            return ping(n)
        """)
    assert cache_keys.callable_identity(ping.ping) == cache_keys.callable_identity(ping.ping)
    depth = code_reach.MAX_NESTING + 2
    chain = _module("reach_chain", "\n".join(f"def f{i}(x):\n    return f{i + 1}(x)" for i in range(depth))
                    + f"\ndef f{depth}(x):\n    return x\n")
    closed = jax.make_jaxpr(jnp.sin)(1.0)
    avals = [jax.ShapeDtypeStruct((), jnp.float32)]
    assert cache_keys.executable_key(chain.f0, closed, avals, {}) is None
    assert cache_keys.executable_key(chain.f6, closed, avals, {}) is not None


def test_libraries_are_named_not_read():
    assert all(code_reach.is_library(m) for m in ("jax.numpy", "numpy", "jaxaot._src.compile", "json", "sys"))
    assert not any(code_reach.is_library(m) for m in (__name__, "__main__", "reach_not_imported"))
