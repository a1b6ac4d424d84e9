"""Recomputation classes and FLOP estimates of jaxaot.cost_model, and the knapsack helpers."""

from __future__ import annotations

import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

from jaxaot._src.partition import Recompute
from jaxaot._src.partition.costs import cost_model
from jaxaot._src.partition.mincut import knapsack


def _flat(eqns):
    for e in eqns:
        if e.primitive.name == "jit":  # jnp functions wrap themselves in jit
            yield from _flat(e.params["jaxpr"].jaxpr.eqns)
        else:
            yield e


def eqns_of(fn, *args):
    return list(_flat(jax.make_jaxpr(fn)(*args).jaxpr.eqns))


def only_eqn(fn, *args, name=None):
    eqns = [e for e in eqns_of(fn, *args) if name is None or e.primitive.name == name]
    assert eqns, f"no {name} eqn"
    return eqns[0]


X = jnp.ones((8, 16))


@pytest.mark.parametrize("fn", [jnp.sin, jnp.tanh, lambda x: x * 2.0, lambda x: x.astype(jnp.bfloat16),
                                lambda x: x.reshape(16, 8), lambda x: jnp.where(x > 0, x, 0.0), lambda x: x.T,
                                lambda x: jnp.broadcast_to(x, (2, 8, 16)), lambda x: x.sum(-1, keepdims=True) * 0 + x])
def test_fusible_ops_are_cheap(fn):
    for e in eqns_of(fn, X):
        if e.primitive.name != "reduce_sum":
            assert cost_model.classify(e) is Recompute.CHEAP, e


def test_reductions_are_cheap_only_when_they_shrink_little():
    assert cost_model.classify(only_eqn(lambda x: x.sum(), X)) is Recompute.EXPENSIVE
    pairs = jnp.ones((8, 16, 2))
    assert cost_model.classify(only_eqn(lambda x: x.sum(-1), pairs)) is Recompute.CHEAP


@pytest.mark.parametrize("fn,args", [
    (jnp.dot, (X, X.T)),
    (lambda x: lax.conv_general_dilated(x, jnp.ones((3, 3, 16, 4)), (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC")), (jnp.ones((1, 8, 8, 16)),)),
    (lambda x: lax.scan(lambda c, y: (c + y, None), x[0], x)[0], (X,)),
    (lambda x: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2), (0, x))[1], (X,)),
    (lambda x: lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x), (X,)),
    (lambda x: jnp.sort(x, axis=-1), (X,)),
])
def test_heavy_ops_are_expensive(fn, args):
    names = {"dot_general", "conv_general_dilated", "scan", "while", "cond", "sort"}
    eqn = next(e for e in eqns_of(fn, *args) if e.primitive.name in names)
    assert cost_model.classify(eqn) is Recompute.EXPENSIVE


def test_effects_and_callbacks_are_never_recomputed():
    def f(x):
        jax.debug.print("{}", x[0, 0])
        return jax.pure_callback(lambda v: v, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    classes = {e.primitive.name: cost_model.classify(e) for e in eqns_of(f, X)}
    assert classes["debug_print"] is Recompute.NEVER or classes.get("debug_callback") is Recompute.NEVER
    assert classes["pure_callback"] is Recompute.NEVER


def test_custom_jvp_is_as_cheap_as_its_body():
    relu = only_eqn(jax.nn.relu, X, name="custom_jvp_call")
    assert cost_model.classify(relu) is Recompute.CHEAP

    @jax.custom_jvp
    def heavy(x):
        return x @ x.T

    heavy.defjvp(lambda p, t: (heavy(p[0]), t[0] @ p[0].T + p[0] @ t[0].T))
    assert cost_model.classify(only_eqn(heavy, X, name="custom_jvp_call")) is Recompute.EXPENSIVE


@pytest.mark.parametrize("name", ["while_loop", "while_loop_stack_output", "scan"])
def test_loops_of_future_modules_match_by_name(name):
    # jaxaot's own loop primitives may not exist yet: an eqn-shaped stand-in.
    aval = jax.ShapeDtypeStruct((4,), jnp.float32)
    var = types.SimpleNamespace(aval=aval)
    eqn = types.SimpleNamespace(primitive=types.SimpleNamespace(name=name), effects=frozenset(), params={},
                                invars=[var], outvars=[var])
    assert cost_model.is_loop(name)
    assert cost_model.classify(eqn) is Recompute.EXPENSIVE


def test_random_bits_on_a_key_are_cheap():
    eqns = eqns_of(lambda k: jax.random.uniform(k, (4, 4)), jax.random.key(0))
    bits = [e for e in eqns if e.primitive.name in ("random_bits", "threefry2x32")]
    assert bits and all(cost_model.classify(e) is Recompute.CHEAP for e in bits)


def test_flops():
    assert cost_model.flops(only_eqn(jnp.dot, X, X.T)) == 2 * 8 * 8 * 16
    conv = only_eqn(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                                          dimension_numbers=("NHWC", "HWIO", "NHWC")),
                    jnp.ones((1, 8, 8, 16)), jnp.ones((3, 3, 16, 4)))
    assert cost_model.flops(conv) == 2 * (8 * 8 * 4) * (3 * 3 * 16)
    scan = only_eqn(lambda x: lax.scan(lambda c, y: (c @ y, None), x[0], jnp.stack([x.T @ x] * 5))[0], X,
                    name="scan")
    assert cost_model.flops(scan) == 5 * 2 * 16 * 16
    assert cost_model.flops(only_eqn(jnp.exp, X)) > cost_model.flops(only_eqn(lambda x: x + 1.0, X))




def test_knapsack_order_and_prefix():
    order = knapsack.recompute_order(np.array([100, 100, 10, 0]), np.array([1e6, 1e2, 1e6, 5.0]))
    assert order.tolist() == [1, 0, 2, 3]  # cheapest per byte first; zero-byte items last
    assert knapsack.smallest_feasible_prefix(lambda k: 10 - k, 10, 10) == 0
    assert knapsack.smallest_feasible_prefix(lambda k: 10 - k, 10, 0) == 10
    probes = []
    knapsack.smallest_feasible_prefix(lambda k: probes.append(k) or 1000 - k, 1000, 500)
    assert len(probes) <= 11


@pytest.mark.parametrize("approximate", [True, False])
def test_activations_and_stop_gradient_are_cheap_in_the_joint_graph(approximate):
    """Every forward eqn of gelu / softmax's joint graph is cheap (jax 0.11's gelu adds
    ``one_minus_square``; softmax's max goes through ``stop_gradient``): none is saved at budget 1
    for being unknown."""
    import jaxaot
    from jaxaot._src.partition import EqnKind, classify_eqns

    def f(x):
        return jnp.sum(jax.nn.gelu(x, approximate=approximate) * jax.nn.softmax(x, axis=-1))

    joint = jaxaot.partition.trace_joint(f, jnp.ones((4, 8)))
    eqns = [e for e, k in zip(jaxaot._src.compat.jaxpr_of(joint.jaxpr).eqns, classify_eqns(joint))
            if k is EqnKind.FORWARD]
    costly = {e.primitive.name for e in eqns if cost_model.classify(e) is not Recompute.CHEAP}
    assert costly <= {"reduce_max", "reduce_sum"}, costly  # softmax's reductions over a short axis
    assert cost_model.classify(only_eqn(lax.stop_gradient, jnp.ones(3), name="stop_gradient")) is Recompute.CHEAP


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 1000), st.floats(1e-3, 1e3)), min_size=1, max_size=8), st.data())
def test_cheapest_last_step_is_feasible_monotone_and_no_slower_than_the_prefix(items, data):
    """Generated knapsacks (bytes saved and seconds per item; overlapping savings capped, as cuts interact):
    across a sweep of targets the chosen sets reach their target, their bytes never grow as the
    target shrinks, and none costs more seconds than the greedy prefix."""
    saving = np.array([b for b, _ in items], float)
    seconds = np.array([s for _, s in items])
    total = 2000.0 + saving.sum()
    overlap = data.draw(st.floats(0.0, 0.5))

    def bytes_of(chosen):  # monotone and sub-additive: recomputing several saves no more than their sum
        picked = saving[list(chosen)]
        return total - (picked.sum() * (1 - overlap) + overlap * picked.max(initial=0.0))

    order = knapsack.recompute_order(saving, seconds)
    ranked = lambda chosen: bytes_of([order[i] for i in chosen])  # noqa: E731 - positions in the order
    ranked_seconds = seconds[order]
    full = ranked(range(len(order)))
    previous = math.inf
    for target in np.linspace(total, full, 25):
        k = knapsack.smallest_feasible_prefix(lambda k: ranked(range(k)), len(order), target)
        chosen = knapsack.cheapest_last_step(ranked, ranked_seconds, k, target)
        got = ranked(chosen)
        assert got <= target + 1e-9
        assert got <= previous + 1e-9
        assert ranked_seconds[chosen].sum() <= ranked_seconds[:k].sum() + 1e-9
        previous = got
