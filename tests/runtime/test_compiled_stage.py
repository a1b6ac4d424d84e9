"""A compiled stage is called as JAX's ``Compiled`` is: on arrays of its signature, from its executables.

``f.lower(...).compile()`` returns the function's outputs when called, ``jaxaot.value_and_grad(f).lower(...)``'s
and ``jaxaot.grad(f).lower(...)``'s compiled stages return what those gradients return, compared here with JAX's
own on fresh random inputs. Arguments of another signature, and tracers, are a ``TypeError`` naming what
differs (as ``jax.jit(f).lower(...).compile()`` raises), after which the stage still runs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from zoo import mlp_args, mlp_gelu, transformer_args, transformer_block


def _key():
    return jax.random.key(int(np.random.default_rng().integers(1 << 30)))


def _close(a, b, tol=1e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


def _loss(p, x):
    return jnp.mean(transformer_block(p, x) ** 2)


@pytest.mark.parametrize("fn, make_args", [(mlp_gelu, mlp_args), (_loss, lambda k: transformer_args(2, 8, 32))])
def test_the_compiled_stage_returns_the_function_outputs_and_compiles_nothing_more(fn, make_args):
    f = jaxaot.aot_function(fn)
    args = make_args(_key())
    compiled = f.lower(*args).compile()
    compiles = f.cache_info().entries[0].compiles
    fresh = jax.tree.map(lambda a: a + 0.1 * jax.random.normal(_key(), a.shape, a.dtype), args)
    _close(compiled(*fresh), jax.jit(fn)(*fresh))
    assert f.cache_info().entries[0].compiles == compiles  # run from the executables it compiled


@pytest.mark.parametrize("has_aux", [False, True])
def test_a_gradients_compiled_stage_returns_what_the_gradient_returns(has_aux):
    def fn(params, x):
        loss = mlp_gelu(params, x)
        return (loss, {"twice": 2 * loss}) if has_aux else loss

    f = jaxaot.aot_function(fn)
    params, x = mlp_args(_key())
    for ours, theirs in ((jaxaot.value_and_grad(f, has_aux=has_aux), jax.value_and_grad(fn, has_aux=has_aux)),
                         (jaxaot.grad(f, argnums=(0, 1), has_aux=has_aux),
                          jax.grad(fn, argnums=(0, 1), has_aux=has_aux))):
        compiled = ours.lower(params, x).compile()
        x2 = jax.random.normal(_key(), x.shape)
        _close(compiled(params, x2), theirs(params, x2))


def test_keyword_and_static_arguments_are_checked_as_positional_ones():
    def fn(x, n, *, scale):
        return jnp.sum(jnp.sin(x) ** n) * scale

    f = jaxaot.aot_function(fn, static_argnums=1)
    x = jax.random.normal(_key(), (5,))
    compiled = f.lower(x, 3, scale=jnp.float32(2.0)).compile()
    _close(compiled(x, 3, scale=jnp.float32(0.5)), fn(x, 3, scale=0.5))
    # as JAX's Compiled is called: the dynamic arguments only
    theirs = jax.jit(fn, static_argnums=1).lower(x, 3, scale=jnp.float32(2.0)).compile()
    _close(compiled(x, scale=jnp.float32(0.5)), theirs(x, scale=jnp.float32(0.5)))
    with pytest.raises(TypeError, match=r"n"):
        compiled(x, 2, scale=jnp.float32(0.5))
    with pytest.raises(TypeError, match=r"scale"):
        compiled(x, 3, scale=jnp.ones(2))


def test_other_argument_types_are_a_type_error_naming_them_and_the_stage_keeps_working():
    f = jaxaot.aot_function(mlp_gelu)
    params, x = mlp_args(_key())
    compiled = f.lower(params, x).compile()
    with pytest.raises(TypeError, match=r"x: shape \(5, 6\) → \(3, 6\)"):
        compiled(params, x[:3])
    with pytest.raises(TypeError, match=r"dtype float32 → float16"):
        compiled(params, x.astype(jnp.float16))
    with pytest.raises(TypeError, match=r"Argument types differ"):
        compiled(params[:1], x)
    with pytest.raises(TypeError, match=r"ShapeDtypeStruct"):
        compiled(params, jax.ShapeDtypeStruct(x.shape, x.dtype))
    _close(compiled(params, x), mlp_gelu(params, x))
    assert len(f.cache_info().entries) == 1  # nothing of the refused calls was traced or compiled


def test_tracers_are_a_type_error_as_for_a_jax_compiled_stage():
    f = jaxaot.aot_function(mlp_gelu)
    params, x = mlp_args(_key())
    compiled = f.lower(params, x).compile()
    jax_compiled = jax.jit(mlp_gelu).lower(params, x).compile()
    for transform in (jax.jit, jax.grad, jax.vmap):
        args = (params, x[None]) if transform is jax.vmap else (params, x)
        if transform is jax.vmap:
            run = transform(compiled, in_axes=(None, 0))
            run_jax = transform(jax_compiled, in_axes=(None, 0))
        else:
            run, run_jax = transform(compiled), transform(jax_compiled)
        with pytest.raises(TypeError):
            run_jax(*args)
        with pytest.raises(TypeError, match="call mlp_gelu itself"):
            run(*args)
    _close(jax.grad(f)(params, x), jax.grad(mlp_gelu)(params, x))  # the function itself composes


def test_a_stage_lowered_from_abstract_inputs_runs_arrays_of_those_types():
    f = jaxaot.aot_function(mlp_gelu)
    params, x = mlp_args(_key())
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (params, x))
    compiled = f.lower(*abstract).compile()
    _close(compiled(params, np.asarray(x)), mlp_gelu(params, x))


def _doubling_loop(x):  # a trip count read off the data: no reverse-mode derivative
    return jax.lax.while_loop(lambda c: c.sum() < 100.0, lambda c: c * 2.0, x)


def _host_sine(x):  # a host callback without a JVP rule
    return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


@pytest.mark.parametrize("fn", [_doubling_loop, _host_sine])
def test_a_function_without_a_reverse_derivative_lowers_and_runs_as_jit_s_stage(fn):
    """``jax.jit(f).lower(x).compile()`` needs no derivative: neither does ``aot_function(f).lower(x)``, whose
    stage then saves nothing and returns the outputs; a gradient raises JAX's own error, as for ``jax.jit(f)``."""
    x = jnp.asarray(np.random.default_rng().uniform(1.0, 2.0, 3), jnp.float32)
    f = jaxaot.aot_function(fn)
    lowered = f.lower(x)
    assert lowered.saved_bytes == 0 and lowered.out_info == jax.jit(fn).lower(x).out_info
    _close(lowered.compile()(x), jax.jit(fn).lower(x).compile()(x))
    with pytest.raises(ValueError) as jax_error:
        jax.grad(lambda x: jnp.sum(jax.jit(fn)(x)))(x)
    with pytest.raises(type(jax_error.value)):
        jax.grad(lambda x: jnp.sum(f(x)))(x)


@jax.custom_vjp
def _broken_rule(x):
    return jnp.sin(x)


def _raise_in_backward(res, g):
    raise ValueError("the rule's own bug")


_broken_rule.defvjp(lambda x: (jnp.sin(x), x), _raise_in_backward)


def test_lower_raises_an_error_of_the_function_s_backward_as_jit_of_its_gradient_does():
    """A custom rule that raises is the function's error, not a missing derivative: ``lower`` raises it, as
    ``jax.jit(jax.grad(f)).lower`` does, and stages no derivative-free programs in its place."""
    x = jnp.asarray(np.random.default_rng().standard_normal(3), jnp.float32)
    loss = lambda x: jnp.sum(_broken_rule(x))  # noqa: E731
    with pytest.raises(ValueError, match="the rule's own bug"):
        jax.jit(jax.grad(loss)).lower(x)
    with pytest.raises(ValueError, match="the rule's own bug"):
        jaxaot.aot_function(loss).lower(x)


def test_lower_raises_the_function_s_own_error_where_its_forward_fails():
    def broken(x):
        return jnp.dot(x, jnp.ones((4, 2)))  # (3,) @ (4, 2): a shape error in the forward itself

    with pytest.raises(TypeError, match="dot_general"):
        jaxaot.aot_function(broken).lower(jnp.ones(3))


def test_compiler_options_are_refused_and_a_compiler_carries_them():
    """``compile(compiler_options=...)`` would compile programs the calls do not run: refused, typed, naming
    the way that works, a compiler of the function's, whose options reach XLA."""
    from jaxaot import compilers
    from jaxaot.errors import InvalidInputError, XlaCompileError

    def loss(x):
        return jnp.sum(jnp.sin(x) ** 2)

    x = jnp.asarray(np.random.default_rng().standard_normal(5), jnp.float32)
    low = jaxaot.aot_function(loss).lower(x)
    with pytest.raises(InvalidInputError, match="fw_compiler"):
        low.compile(compiler_options={"xla_embed_ir_in_executable": True})
    assert float(low.compile()(x)) == pytest.approx(float(loss(x)), rel=1e-6)

    def with_options(options):
        def compiler(closed, avals, donate_argnums=()):
            jitted = jax.jit(compilers.as_function(closed), donate_argnums=tuple(donate_argnums), keep_unused=True)
            return jitted.lower(*avals).compile(compiler_options=options)
        return compiler

    value, grad = jaxaot.value_and_grad(jaxaot.aot_function(loss, fw_compiler=with_options(
        {"xla_embed_ir_in_executable": True})))(x)
    want = jax.value_and_grad(loss)(x)
    np.testing.assert_allclose(value, want[0], rtol=1e-6)
    np.testing.assert_allclose(grad, want[1], rtol=1e-6, atol=1e-7)
    with pytest.raises(XlaCompileError, match="no_such_option"):
        jax.grad(jaxaot.aot_function(loss, fw_compiler=with_options({"no_such_option": 1})))(x)
