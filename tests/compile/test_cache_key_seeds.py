"""Cache keys are the same in every process whatever ``PYTHONHASHSEED``.

The attack was benign but costly: a partitioner closing over a set of strings
got a new key under each hash seed (its ``repr`` lists the set in hash order),
so a warm cache never hit. Every value in a key now has a canonical form.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
from zoo import child_env

from jaxaot._src.compile import cache_keys

_CHILD = textwrap.dedent(
    """
    import dataclasses, enum, functools, json
    import jax, jax.numpy as jnp
    import jaxaot
    from jaxaot._src.compile import cache_keys, compilers

    class Mode(enum.Enum):
        FAST = 1

    NAMES = {"dot_general", "tanh", "sin", "exp", "mul", "add", "reduce_sum", "transpose"}
    WEIGHTS = {"tanh": 2.0, "sin": 1.5, "exp": {3, 4, 5}, ("nested", 1): frozenset({"p", "q", "r", "s"})}
    NESTED = (("x", frozenset({"p", "q", "r"})), (1, (2.5, -0.0, None, {"k": {"v", "w"}})), Mode.FAST)

    def set_partitioner(joint):
        _ = NAMES, WEIGHTS, NESTED
        return jaxaot.partition.default_partition(joint)

    def closing(names, weights, nested):
        def partition(joint):
            if str(joint) in {"never", "a", "b", "c", "d"}:  # a frozenset constant in the code
                return None
            return jaxaot.partition.default_partition(joint) if (names, weights, nested) else None
        return partition

    @dataclasses.dataclass(frozen=True)
    class Configured:
        ops: frozenset
        budgets: dict

        def __call__(self, joint):
            return jaxaot.partition.default_partition(joint)

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    joint = jaxaot.partition.trace_joint(loss, jnp.ones((3, 2)), jnp.ones((4, 3)))
    partitioners = {
        "module_globals": set_partitioner,
        "closure": closing(NAMES, WEIGHTS, NESTED),
        "partial_kw": functools.partial(lambda joint, ops=None: jaxaot.partition.default_partition(joint), ops=NAMES),
        "dataclass": Configured(frozenset(NAMES), {"b": 1.0, "a": {2, 3}}),
    }
    keys = {name: cache_keys.partition_key(p, joint.recipe) for name, p in partitioners.items()}
    closed = jax.make_jaxpr(loss)(jnp.ones((3, 2)), jnp.ones((4, 3)))
    avals = [jax.ShapeDtypeStruct((3, 2), jnp.float32), jax.ShapeDtypeStruct((4, 3), jnp.float32)]
    keys["executable"] = cache_keys.executable_key(
        functools.partial(compilers.xla), closed, avals, {"donate_argnums": (0,), "tags": NAMES})
    keys["value_identity"] = cache_keys.value_identity((NAMES, WEIGHTS, NESTED))
    print("KEYS" + json.dumps(keys))
    """
)


def _child_keys(seed: str) -> dict:
    env = dict(child_env(), PYTHONHASHSEED=seed, JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300,
                         cwd=tempfile.gettempdir())
    assert run.returncode == 0, run.stderr[-3000:]
    line = [ln for ln in run.stdout.splitlines() if ln.startswith("KEYS")][-1]
    return json.loads(line[len("KEYS"):])


def test_keys_are_equal_under_different_hash_seeds():
    a, b = _child_keys("1"), _child_keys("4242")
    assert all(v is not None for v in a.values()), a
    assert a == b


def test_canonical_values_still_tell_values_apart():
    ident = cache_keys.value_identity
    assert ident({"a", "b"}) == ident({"b", "a"}) and ident({"a", "b"}) != ident({"a", "c"})
    assert ident({"a": 1, "b": 2}) == ident({"b": 2, "a": 1}) != ident({"a": 2, "b": 1})
    assert len({ident(1), ident(1.0), ident(True), ident("1"), ident(np.int32(1))}) == 5
    assert ident(0.0) != ident(-0.0) and ident(float("nan")) == ident(float("nan"))
    assert ident(frozenset({1})) != ident({1}) and ident((1, 2)) != ident([1, 2])
    assert ident(((1, {2, 3}),)) == ident(((1, {3, 2}),))
