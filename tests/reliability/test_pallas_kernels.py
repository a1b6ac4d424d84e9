"""A Pallas kernel in the user's function (``interpret=True`` on the CPU), against JAX on fresh random inputs: the
persistent cache keys a kernel's index maps, which its printed jaxpr leaves out; compiled autograd compiles a step
with a kernel once; ``lower()`` of a function whose kernel reads an input stages its forward alone, as
``jax.jit(f).lower`` does, and a gradient through the kernel raises JAX's error with a note naming it; and
``patch_while_loop`` leaves a kernel's own loops to Pallas."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import jaxaot
from zoo import assert_trees_close, key_stream

pl = pytest.importorskip("jax.experimental.pallas", reason="jax.experimental.pallas is not importable here")
fresh_key = key_stream(9600)


def _double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def _kernel(index_map=lambda i: (i, 0)):
    def run(x):
        return pl.pallas_call(_double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                              in_specs=[pl.BlockSpec((2, 8), index_map)],
                              out_specs=pl.BlockSpec((2, 8), lambda i: (i, 0)), interpret=True)(x)
    return run


def _loss_of(kernel):
    return lambda w, x: jnp.sum(jnp.tanh(kernel(x) @ w) * jnp.arange(4.0)[:, None])


def _args():
    kw, kx = jax.random.split(fresh_key())
    return jax.random.normal(kw, (8, 8)), jax.random.normal(kx, (4, 8))


def test_kernels_differing_only_in_their_index_maps_compile_apart(tmp_path):
    straight, swapped = _loss_of(_kernel()), _loss_of(_kernel(lambda i: (1 - i, 0)))
    w, x = _args()
    with jaxaot.config.override(cache_dir=str(tmp_path)):
        for loss in (straight, swapped, straight):
            f = jaxaot.aot_function(loss)
            assert_trees_close(f(w, x), jax.jit(loss)(w, x))
            assert_trees_close(jaxaot.value_and_grad(f)(w, x), jax.value_and_grad(loss)(w, x))


def test_compiled_autograd_compiles_a_step_with_a_kernel_once():
    loss = _loss_of(_kernel())
    vg = jaxaot.compiled_value_and_grad(loss)
    for _ in range(4):
        w, x = _args()
        assert_trees_close(vg(w, x), jax.value_and_grad(loss)(w, x))
    assert len(vg.cache_info().entries) == 1


def test_lowering_a_function_whose_kernel_reads_an_input_stages_its_forward():
    loss = _loss_of(_kernel())
    w, x = _args()
    f = jaxaot.aot_function(loss)
    assert_trees_close(f.lower(w, x).compile()(w, x), jax.jit(loss)(w, x))
    with pytest.raises(ValueError, match="Linearization failed") as info:  # JAX's error, as jax.grad raises it
        jaxaot.export.export(f, w, x)  # every inexact input differentiated: through the kernel too
    assert any("pallas_call" in note and "custom_vjp" in note for note in info.value.__notes__)


def test_a_kernel_s_own_loop_stays_lax_s_in_a_patch_while_loop_block():
    def halve_three_times(x_ref, o_ref):
        _, v = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 0.5), (0, x_ref[...]))
        o_ref[...] = v

    kernel = lambda x: pl.pallas_call(halve_three_times, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),  # noqa: E731
                                      interpret=True)(x)
    x = jax.random.normal(fresh_key(), (8, 128))
    with jaxaot.loops.patch_while_loop(max_steps=50):
        jaxpr = jax.make_jaxpr(kernel)(x)
        got = jax.jit(kernel)(x)
    (call,) = [e for e in jaxpr.eqns if "pallas" in str(e.primitive)]
    assert [str(e.primitive) for e in call.params["jaxpr"].eqns if "while" in str(e.primitive)] == ["while"]
    assert_trees_close(got, x / 8)
