"""``aot_function``'s ``static_argnums`` and ``donate_argnums`` are checked against ``fn``'s positional parameters
as ``jax.jit`` checks them: beyond them is a typed ``ValueError`` when the function is wrapped, and a repeated
position counts once. A negative position (``jax.jit`` counts it from the end of each call) is a typed error naming
the position it stands for; a generator function is refused when wrapped, as ``jax.jit`` does. Results are compared
with ``jax.jit``'s on fresh random inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot.errors import InvalidInputError, InvalidValueError
from zoo import assert_trees_close, key_stream

fresh_key = key_stream(7100)


def _two(x, y):
    return jnp.sum(jnp.tanh(x) * y)


def _scaled(x, n):
    return jnp.sum(jnp.sin(x) ** 2) * n


def _xy():
    kx, ky = jax.random.split(fresh_key())
    return jax.random.normal(kx, (4, 3)), jax.random.normal(ky, (4, 3))


@pytest.mark.parametrize("option", ["static_argnums", "donate_argnums"])
@pytest.mark.parametrize("nums", [5, (5,), (0, 2), [1, 2, 1]])
def test_out_of_range_positions_are_a_value_error_when_wrapped(option, nums):
    with pytest.raises(ValueError, match="only accepts 2 positional"):  # jax.jit's own error, when wrapped
        jax.jit(_two, **{option: nums})
    with pytest.raises(InvalidValueError, match=rf"{option}=.* names position \d, but _two accepts only 2 "
                                                r"positional argument\(s\): pass positions from 0 to 1"):
        jaxaot.aot_function(_two, **{option: nums})


def test_out_of_range_positions_of_a_function_without_positional_parameters():
    with pytest.raises(InvalidValueError, match=r"accepts only 0 positional argument\(s\): leave static_argnums out"):
        jaxaot.aot_function(lambda *, x: x, static_argnums=0)


@pytest.mark.parametrize("static", [(1, 1), [1, 1, 1]])
def test_repeated_static_positions_count_once_as_in_jit(static):
    f, jitted = jaxaot.aot_function(_scaled, static_argnums=static), jax.jit(_scaled, static_argnums=static)
    assert f.static_argnums == (1,)
    for n in (2.0, 3.0, 2.0):
        x, _ = _xy()
        assert_trees_close(f(x, n), jitted(x, n))
        assert_trees_close(jax.grad(f)(x, n), jax.grad(jitted)(x, n))
    assert f.cache_info().misses == 2


def _pair(x, y):
    return jnp.tanh(x) * y, x + y


@pytest.mark.parametrize("donate", [(0, 0), [1, 1]])
def test_repeated_donated_positions_count_once(donate):
    f = jaxaot.aot_function(_pair, donate_argnums=donate)
    assert f.donate_argnums == (donate[0],)
    x, y = _xy()
    assert_trees_close(f(jnp.array(x), jnp.array(y)), jax.jit(_pair)(x, y))


@pytest.mark.parametrize("option", ["static_argnums", "donate_argnums"])
@pytest.mark.parametrize("nums,stands_for", [(-1, r" \(position 1 of _two's 2 positional parameters\)"),
                                             ((0, -2), r" \(position 0 of _two's 2 positional parameters\)"),
                                             (-3, "")])
def test_negative_positions_are_a_typed_error_naming_the_position(option, nums, stands_for):
    with pytest.raises(InvalidInputError, match=rf"{option}=.* has the negative position -\d: pass positions counted "
                                                rf"from the first argument{stands_for}\."):
        jaxaot.aot_function(_two, **{option: nums})


def test_negative_positions_of_varargs_are_a_typed_error():
    with pytest.raises(InvalidInputError, match=r"negative position -1: pass positions counted from the first "
                                                r"argument\. Static"):
        jaxaot.aot_function(lambda *a: a[0] * a[1], static_argnums=-1)


def test_varargs_take_any_non_negative_position_as_jit():
    fn = lambda *a: jnp.sum(a[0] * a[1])  # noqa: E731
    f, jitted = jaxaot.aot_function(fn, donate_argnums=5), jax.jit(fn, donate_argnums=5)
    x, y = _xy()
    assert_trees_close(f(x, y), jitted(x, y))


def _gen(x):
    yield jnp.sin(x)


async def _agen(x):
    yield x


@pytest.mark.parametrize("gen", [_gen, _agen])
def test_generator_functions_are_refused_when_wrapped(gen):
    with pytest.raises(TypeError, match="generator function"):
        jax.jit(_gen)
    with pytest.raises(InvalidInputError, match=r"aot_function expects a function that returns arrays, got a "
                                                r"generator function .*cannot be traced"):
        jaxaot.aot_function(gen)
