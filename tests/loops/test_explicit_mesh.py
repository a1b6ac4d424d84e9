"""Loops on a mesh with ``Explicit`` axes: the sharding is part of each value's type (``float32[8@d,4]``).

Every reverse mode's bookkeeping (stacks, snapshots, cotangent accumulators, the schedule's tables) is typed
as the rows it holds, so gradients equal ``lax.fori_loop``'s under ``jax.grad`` and come out sharded as JAX's
do. The mesh takes the largest of 1, 2, 4 and 8 devices the backend has (eight CPU host devices under
tests/conftest.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxaot
from zoo import assert_trees_close

N = max(n for n in (1, 2, 4, 8) if n <= jax.device_count())
STEPS = 3


def _mesh():
    return jax.make_mesh((N,), ("d",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:N])


def _step(h, w):
    return jnp.tanh(h * w + jnp.sin(w))


def _loop_loss(options):
    def loss(w, x):
        _, h = jaxaot.loops.while_loop(lambda c: c[0] < STEPS, lambda c: (c[0] + 1, _step(c[1], w)), (0, x),
                                       **options)
        return jnp.sum(h**2)

    return loss


def _reference(w, x):
    return jnp.sum(lax.fori_loop(0, STEPS, lambda i, h: _step(h, w), x) ** 2)


def _inputs(mesh):
    """A replicated weight and a batch sharded by rows (an ``Explicit`` mesh refuses a product of two sharded
    operands whose result would shard one axis twice, so the weight is replicated, as FSDP-free code has it)."""
    rng = np.random.default_rng()
    w = jax.device_put(jnp.asarray(rng.normal(size=(8, 4)), jnp.float32), NamedSharding(mesh, P()))
    x = jax.device_put(jnp.asarray(rng.normal(size=(8, 4)), jnp.float32), NamedSharding(mesh, P("d", None)))
    return w, x


def _assert_like_jax(got, want):
    assert_trees_close(got, want, rtol=1e-4, atol=1e-5)
    assert [jax.typeof(g).sharding.spec for g in got] == [jax.typeof(g).sharding.spec for g in want]


GRADIENTS = {
    "max_steps": lambda: jax.jit(jax.grad(_loop_loss({"max_steps": 5}), argnums=(0, 1))),
    "checkpoints": lambda: jax.jit(jax.grad(_loop_loss({"checkpoints": 2}), argnums=(0, 1))),
    "host_snapshots": lambda: jax.jit(jax.grad(_loop_loss({"max_steps": 8, "checkpoints": 2,
                                                           "checkpoint_memory": "host"}), argnums=(0, 1))),
    "aot_function_sizes_the_stack": lambda: jax.grad(jaxaot.aot_function(_loop_loss({})), argnums=(0, 1)),
    "fused_step": lambda: jaxaot.grad(jaxaot.aot_function(_loop_loss({})), argnums=(0, 1)),
    "aot_function_under_jit": lambda: jax.jit(jax.grad(jaxaot.aot_function(_loop_loss({"max_steps": 5})),
                                                       argnums=(0, 1))),
}


@pytest.mark.parametrize("name", sorted(GRADIENTS))
def test_gradients_equal_fori_loop_s_with_its_shardings(name):
    mesh = _mesh()
    with jax.set_mesh(mesh):
        w, x = _inputs(mesh)
        _assert_like_jax(GRADIENTS[name]()(w, x), jax.jit(jax.grad(_reference, argnums=(0, 1)))(w, x))


@pytest.mark.parametrize("name", sorted(set(GRADIENTS) - {"aot_function_sizes_the_stack"}))
def test_arrays_on_an_explicit_mesh_need_no_context_mesh_as_under_jit(name):
    """Outside ``jax.set_mesh``: the arrays carry their mesh, and ``jit`` of ``lax.fori_loop`` takes them so.
    (Eager ``jax.grad`` is left out: JAX's own, of any function, needs the context mesh for its cotangent.)"""
    w, x = _inputs(_mesh())
    _assert_like_jax(GRADIENTS[name]()(w, x), jax.jit(jax.grad(_reference, argnums=(0, 1)))(w, x))


def test_blocked_lowering_and_rewritten_lax_loops():
    """The GPU lowering (blocks of a constant trip count) and ``differentiable``'s rewrite of a ``lax`` loop."""
    def lax_loss(w, x):
        return jnp.sum(lax.while_loop(lambda c: c[0] < STEPS, lambda c: (c[0] + 1, _step(c[1], w)), (0, x))[1] ** 2)

    mesh = _mesh()
    with jax.set_mesh(mesh):
        w, x = _inputs(mesh)
        want = jax.jit(jax.grad(_reference, argnums=(0, 1)))(w, x)
        with jaxaot.config.override(blocked_loops=True):
            _assert_like_jax(jax.jit(jax.grad(_loop_loss({"max_steps": 40}), argnums=(0, 1)))(w, x), want)
        rewritten = jaxaot.loops.differentiable(lax_loss, checkpoints=2)
        _assert_like_jax(jax.jit(jax.grad(rewritten, argnums=(0, 1)))(w, x), want)


def test_stacked_outputs_forward_mode_and_vmap():
    def stacked(w, x):
        (_, hs), _ = jaxaot.loops.while_loop_stack_output(lambda c: c[0] < STEPS,
                                                          lambda c: (c[0] + 1, _step(c[1], w)), (0, x), max_steps=5)
        return jnp.sum(hs[STEPS - 1] ** 2) + jnp.sum(hs[: STEPS - 1] ** 3)

    def scanned(w, x):
        hs = lax.scan(lambda h, _: (_step(h, w),) * 2, x, None, length=STEPS)[1]
        return jnp.sum(hs[-1] ** 2) + jnp.sum(hs[:-1] ** 3)

    mesh = _mesh()
    with jax.set_mesh(mesh):
        w, x = _inputs(mesh)
        _assert_like_jax(jax.jit(jax.grad(stacked, argnums=(0, 1)))(w, x),
                         jax.jit(jax.grad(scanned, argnums=(0, 1)))(w, x))
        tangent = jax.jit(lambda w, x: jax.jvp(_loop_loss({}), (w, x), (w, x))[1])(w, x)
        assert_trees_close(tangent, jax.jvp(_reference, (w, x), (w, x))[1], rtol=1e-4, atol=1e-5)
        batched = jax.jit(jax.vmap(jax.grad(_loop_loss({"max_steps": 5}))))(jnp.stack([w, 2 * w]), jnp.stack([x, x]))
        assert_trees_close(batched, jax.vmap(jax.grad(_reference))(jnp.stack([w, 2 * w]), jnp.stack([x, x])),
                           rtol=1e-4, atol=1e-5)
