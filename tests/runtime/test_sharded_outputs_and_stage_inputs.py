"""Where a sharded signature's outputs land and which arrays its compiled stage takes, each against ``jax.jit``.

- ``residual_sharding="replicated"`` copies the residuals to every device; the function's own outputs keep the
  shardings ``jax.jit(f)`` gives them (and the default policy gives them), from ``forward``, ``jax.vjp`` and a
  call, on a 2-D and a 1-D mesh, with gradients equal to JAX's.
- A stage compiled for sharded inputs (``f.lower(x_sharded).compile()``) takes uncommitted arrays (made without
  ``device_put``, or NumPy arrays) and copies them where it was compiled for, as JAX's ``Compiled`` does; an
  array committed elsewhere is a :class:`~jaxaot.errors.ShardingMismatchError`, a ``ValueError`` as JAX's.
- The function itself, called on uncommitted arrays after sharded ones, runs them where ``jax.jit`` does.

Meshes are sized from ``N``, the largest of 1, 2, 4 and 8 devices there are (tests/conftest.py gives eight CPU
devices unless ``XLA_FLAGS`` names a count); on one device every sharding is the same, and the tests that compare
placements skip.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxaot
from jaxaot.errors import ShardingMismatchError
from zoo import assert_trees_close, key_stream

N = max(n for n in (1, 2, 4, 8) if n <= jax.device_count())
MODEL = min(N, 2)
needs_two = pytest.mark.skipif(N < 2, reason="compares placements over two or more devices; one device has "
                               "only one (XLA_FLAGS=--xla_force_host_platform_device_count=2 on a CPU)")
fresh_key = key_stream(9100)


def _mesh(kind):
    shape, names = ((N // MODEL, MODEL), ("data", "model")) if kind == "2d" else ((N,), ("data",))
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape),
                         devices=jax.devices()[:N])


def _specs(kind):
    return (P(None, "model"), P("data")) if kind == "2d" else (P(), P("data"))


def _fresh():
    """Uncommitted random ``w`` (8, 16) and ``x`` (16, 8)."""
    k1, k2 = jax.random.split(fresh_key())
    return jax.random.normal(k1, (8, 16)) / 3, jax.random.normal(k2, (16, 8))


def _sharded(kind):
    mesh = _mesh(kind)
    return mesh, tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(_fresh(), _specs(kind)))


def scaled_tanh(w, x):
    return jnp.tanh(x @ w) * 3


def two_layers(w, x):
    return jnp.tanh(x @ w) @ w.T


def two_outputs(w, x):
    h = jnp.tanh(x @ w)
    return {"h": 2 * h, "rows": jnp.sum(jnp.sin(x @ w) * h, axis=1)}


def loss(w, x):
    return jnp.mean(two_layers(w, x) ** 2)


def _same(ours, theirs):
    """Equal values (as JAX's, to float32 rounding) and equivalent shardings, leaf by leaf."""
    assert_trees_close(ours, theirs, rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim), f"{a.sharding} != jax's {b.sharding}"


def _cotangents(outs):
    return jax.tree.map(lambda o: jax.random.normal(fresh_key(), o.shape, o.dtype), outs)


# --------------------------------------------------------------------------- replicated residuals
@needs_two
@pytest.mark.parametrize("kind", ["2d", "1d"])
@pytest.mark.parametrize("fn", [scaled_tanh, two_layers, two_outputs], ids=lambda f: f.__name__)
def test_replicated_residuals_leave_the_outputs_where_jit_puts_them(kind, fn):
    _, (w, x) = _sharded(kind)
    f = jaxaot.aot_function(fn, residual_sharding="replicated")
    expected = jax.jit(fn)(w, x)
    out, res = f.forward(w, x)
    _same(out, expected)
    _same(out, jaxaot.aot_function(fn).forward(w, x)[0])  # as the default policy places them
    temporaries = res.arrays[len(res.training.partition.saved_inputs):]
    assert temporaries and all(a.sharding.is_fully_replicated for a in temporaries)
    primal, vjp = jax.vjp(f, w, x)
    _same(primal, expected)
    _same(f(w, x), expected)
    ct = _cotangents(expected)
    theirs = jax.vjp(fn, w, x)[1](ct)
    _same(f.backward(res, ct), theirs)
    _same(vjp(ct), theirs)


@needs_two
@pytest.mark.parametrize("kind", ["2d", "1d"])
def test_replicated_residuals_give_jax_grads_and_outputs_placed_as_jit_places_them(kind):
    _, (w, x) = _sharded(kind)
    f = jaxaot.aot_function(two_layers, residual_sharding="replicated")

    def with_output(w, x):  # the output rides along as aux: it comes from the forward executable
        out = f(w, x)
        return jnp.mean(out ** 2), out

    (value, out), grads = jax.value_and_grad(with_output, argnums=(0, 1), has_aux=True)(w, x)
    _same(out, jax.jit(two_layers)(w, x))
    _same((value, grads), jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(w, x))
    _same(grads, jax.grad(loss, argnums=(0, 1))(w, x))


# --------------------------------------------------------------------------- compiled stages and placement
@needs_two
@pytest.mark.parametrize("kind", ["2d", "1d"])
def test_a_stage_compiled_for_sharded_inputs_places_uncommitted_arrays_as_jax_does(kind):
    _, (w, x) = _sharded(kind)
    ours = jaxaot.aot_function(two_layers).lower(w, x).compile()
    theirs = jax.jit(two_layers).lower(w, x).compile()
    w2, x2 = _fresh()
    assert not w2.committed and not x2.committed
    for args in ((w2, x2), (np.asarray(w2), np.asarray(x2)), (w, x2)):
        _same(ours(*args), theirs(*args))
    _same(ours(w, x), theirs(w, x))


@needs_two
@pytest.mark.parametrize("kind", ["2d", "1d"])
def test_a_gradients_stage_compiled_for_sharded_inputs_places_uncommitted_arrays_as_jax_does(kind):
    _, (w, x) = _sharded(kind)
    f = jaxaot.aot_function(loss)
    for ours, theirs in ((jaxaot.value_and_grad(f), jax.value_and_grad(loss)),
                         (jaxaot.grad(f, argnums=(0, 1)), jax.grad(loss, argnums=(0, 1)))):
        compiled, jax_compiled = ours.lower(w, x).compile(), jax.jit(theirs).lower(w, x).compile()
        w2, x2 = _fresh()
        _same(compiled(w2, x2), jax_compiled(w2, x2))


@needs_two
@pytest.mark.parametrize("kind", ["2d", "1d"])
def test_arrays_committed_elsewhere_are_a_sharding_error_as_jax_raises_a_value_error(kind):
    """An array committed to another placement is refused as JAX refuses it; one whose sharding places it the
    same way (``P('data')`` and ``P()`` where ``data`` has one device) runs, as JAX runs it, compiling nothing."""
    mesh, (w, x) = _sharded(kind)
    f = jaxaot.aot_function(two_layers)
    ours = f.lower(w, x).compile()
    theirs = jax.jit(two_layers).lower(w, x).compile()
    _, x2 = _fresh()
    refused = 0
    for elsewhere in (jax.device_put(x2, NamedSharding(mesh, P())), jax.device_put(x2, jax.devices()[0])):
        try:
            expected = theirs(w, elsewhere)
        except ValueError as e:
            assert "compiled for input shardings" in str(e)
            refused += 1
            with pytest.raises(ShardingMismatchError, match=r"x is committed to .* compiled for .*jax\.device_put"):
                ours(w, elsewhere)
        else:
            _same(ours(w, elsewhere), expected)
    assert refused >= 1  # one device alone is never where a stage of several devices was compiled for
    _same(ours(w, x2), theirs(w, x2))  # the stage keeps working
    assert len(f.cache_info().entries) == 1


@pytest.mark.parametrize("kind", ["2d", "1d"])
def test_the_function_runs_uncommitted_arrays_after_sharded_ones_where_jit_does(kind):
    _, (w, x) = _sharded(kind)
    f = jaxaot.aot_function(two_layers)
    _same(f(w, x), jax.jit(two_layers)(w, x))
    w2, x2 = _fresh()
    _same(f(w2, x2), jax.jit(two_layers)(w2, x2))
    _same(f(w, x2), jax.jit(two_layers)(w, x2))
    g = jaxaot.aot_function(loss)
    _same(jax.value_and_grad(g)(w, x), jax.jit(jax.value_and_grad(loss))(w, x))
    _same(jax.value_and_grad(g)(w2, x2), jax.jit(jax.value_and_grad(loss))(w2, x2))
