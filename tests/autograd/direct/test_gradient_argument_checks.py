"""``jaxaot.value_and_grad`` / ``jaxaot.grad`` refuse, when built, what ``jax.value_and_grad`` cannot
differentiate: a generator function (JAX's ``TypeError``) and ``argnums`` naming one argument twice (JAX fails at
the call, or returns ``None`` for the repeated one); ``(0, -2)`` at a call of two arguments, and ``argnums`` out of
range of a call (JAX's bare ``TypeError``), are typed errors at that call. Distinct ``argnums`` give JAX's results on
fresh random inputs, NumPy integers among them (JAX reads ``argnums`` with ``operator.index``)."""

from __future__ import annotations

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot.errors import InvalidInputError
from zoo import assert_trees_close, key_stream

fresh_key = key_stream(7300)


def _loss(w, x):
    return jnp.sum(jnp.tanh(x @ w) ** 2)


def _args():
    kw, kx = jax.random.split(fresh_key())
    return jax.random.normal(kw, (3, 2)), jax.random.normal(kx, (4, 3))


def _gen(w, x):
    yield _loss(w, x)


def _functions():
    return [_loss, jaxaot.aot_function(_loss)]


@pytest.mark.parametrize("make", [jaxaot.value_and_grad, jaxaot.grad])
@pytest.mark.parametrize("argnums", [(0, 0), [1, 1], (0, 1, 0), (-1, -1)])
def test_repeated_argnums_are_refused_when_built(make, argnums):
    with pytest.raises(TypeError):  # JAX's own failure, at the call
        jax.value_and_grad(_loss, argnums=argnums)(*_args())
    for fun in _functions():
        named = re.escape(f"argnums={argnums!r} of {make.__name__} names argument ")
        with pytest.raises(InvalidInputError, match=named + r"-?\d more than once"):
            make(fun, argnums=argnums)


@pytest.mark.parametrize("make", [jaxaot.value_and_grad, jaxaot.grad])
@pytest.mark.parametrize("argnums", [(0, -2), (-1, 1)])
def test_argnums_of_both_signs_naming_one_argument_are_refused_at_the_call(make, argnums):
    for fun in _functions():
        g = make(fun, argnums=argnums)
        with pytest.raises(InvalidInputError, match="names argument . more than once"):
            g(*_args())


@pytest.mark.parametrize("argnums", [(0, -1), (-1, 0), (-2,), -1, np.int64(1), np.int32(-2), (np.int64(0), 1),
                                     [np.int16(-1)], jnp.int32(0), range(2)])
def test_distinct_argnums_of_both_signs_and_numpy_integers_match_jax(argnums):
    """As ``jaxaot.value_and_grad`` and ``grad`` take them, and compiled autograd's ``compiled_value_and_grad``
    and ``compiled_grad``."""
    for fun in _functions():
        vg, g = jaxaot.value_and_grad(fun, argnums=argnums), jaxaot.grad(fun, argnums=argnums)
        for _ in range(2):
            args = _args()
            assert_trees_close(vg(*args), jax.value_and_grad(_loss, argnums=argnums)(*args))
            assert_trees_close(g(*args), jax.grad(_loss, argnums=argnums)(*args))
    args = _args()
    cvg, cg = jaxaot.compiled_value_and_grad(_loss, argnums), jaxaot.compiled_grad(_loss, argnums)
    assert_trees_close(cvg(*args), jax.value_and_grad(_loss, argnums=argnums)(*args))
    assert_trees_close(cg(*args), jax.grad(_loss, argnums=argnums)(*args))


@pytest.mark.parametrize("make", [jaxaot.value_and_grad, jaxaot.grad])
def test_generator_functions_are_refused_when_built(make):
    with pytest.raises(TypeError, match="generator function"):
        jax.value_and_grad(_gen)
    with pytest.raises(InvalidInputError, match=rf"{make.__name__} expects a function that returns arrays, got a "
                                                r"generator function .*cannot be traced"):
        make(_gen)
    with pytest.raises(InvalidInputError, match="cannot be traced"):
        make(_gen, holomorphic=True)


@pytest.mark.parametrize("make", [jaxaot.value_and_grad, jaxaot.grad])
@pytest.mark.parametrize("holomorphic", [False, True])
def test_out_of_range_argnums_of_any_function_are_a_typed_error_at_the_call(make, holomorphic):
    with pytest.raises(TypeError):  # JAX's own, untyped
        jax.value_and_grad(_loss, argnums=2)(*_args())
    for fun in _functions():
        g = make(fun, argnums=(0, 2), holomorphic=holomorphic)
        with pytest.raises(InvalidInputError, match=r"out of range: _loss got 2 positional argument\(s\)"):
            g(*_args())
        with pytest.raises(InvalidInputError, match="out of range"):
            jax.jit(g)(*_args())


@pytest.mark.parametrize("make", [jaxaot.value_and_grad, jaxaot.grad])
@pytest.mark.parametrize("argnums", [True, np.bool_(False), np.float32(1.0), (0, np.float64(1.0)), (np.int64(0), 0)])
def test_argnums_that_are_no_distinct_integers_are_refused_when_built(make, argnums):
    for fun in _functions():
        with pytest.raises(InvalidInputError, match=f"argnums.* of {make.__name__}"):
            make(fun, argnums=argnums)


GRADIENTS = {"value_and_grad": (jaxaot.value_and_grad, jax.value_and_grad), "grad": (jaxaot.grad, jax.grad),
             "compiled_value_and_grad": (jaxaot.compiled_value_and_grad, jax.value_and_grad),
             "compiled_grad": (jaxaot.compiled_grad, jax.grad)}


@pytest.mark.parametrize("name", sorted(GRADIENTS))
def test_the_options_are_jax_s_in_jax_s_order(name):
    """A call written for ``jax.grad`` runs unchanged: ``holomorphic``, ``allow_int`` and ``reduce_axes`` by
    position, and a non-empty ``reduce_axes`` refused with JAX's own error."""
    ours, theirs = GRADIENTS[name]
    jax_order = list(inspect.signature(theirs).parameters)
    assert list(inspect.signature(ours).parameters)[:len(jax_order)] == jax_order
    rng = np.random.default_rng()
    z = jnp.asarray(rng.normal(size=3) + 1j * rng.normal(size=3), jnp.complex64)
    holo = lambda v: jnp.sum(jnp.sin(v) ** 2)  # noqa: E731
    for fun in (holo, jaxaot.aot_function(holo)):
        assert_trees_close(ours(fun, 0, False, True)(z), theirs(holo, 0, False, True)(z))
    w, x = _args()
    assert_trees_close(ours(_loss, 0, False, False, False, ())(w, x), theirs(_loss, 0, False, False, False, ())(w, x))
    with pytest.raises(NotImplementedError, match="reduce_axes argument to grad is deprecated"):
        theirs(_loss, reduce_axes=("batch",))
    with pytest.raises(NotImplementedError, match="reduce_axes argument to grad is deprecated"):
        ours(_loss, reduce_axes=("batch",))


def _scaled_loss(w, x, n):
    """A loss whose last argument is a Python int."""
    return jnp.sum(jnp.tanh(x @ w) ** n)


@pytest.mark.parametrize("name, kind", [(n, k) for n in sorted(GRADIENTS) for k in ("function", "allow_int")]
                         + [("value_and_grad", "aot_function"), ("grad", "aot_function")])
def test_a_gradient_carries_its_functions_names_and_signature_as_jax_s_does(name, kind):
    """The result is named after the function and has its signature, as JAX's is: ``jax.jit(...,
    static_argnames=...)`` reads the signature to find the static argument's position."""
    ours, theirs = GRADIENTS[name]
    fun = jaxaot.aot_function(_scaled_loss, static_argnums=2) if kind == "aot_function" else _scaled_loss
    grad = ours(fun, allow_int=True) if kind == "allow_int" else ours(fun)
    want = theirs(_scaled_loss)
    assert (grad.__name__, grad.__qualname__, grad.__module__) == (want.__name__, want.__qualname__, want.__module__)
    assert inspect.signature(grad) == inspect.signature(want)
    assert "_scaled_loss" in grad.__doc__ and "positional argument(s) 0" in grad.__doc__
    w, x = _args()
    n = int(np.random.default_rng().integers(2, 5))
    assert_trees_close(jax.jit(grad, static_argnames="n")(w, x, n), jax.jit(want, static_argnames="n")(w, x, n))


_ALL_GRADIENTS = {
    "value_and_grad": lambda f, n: jaxaot.value_and_grad(f, argnums=n),
    "grad": lambda f, n: jaxaot.grad(f, argnums=n),
    "aot_function's value_and_grad": lambda f, n: jaxaot.value_and_grad(jaxaot.aot_function(f), argnums=n),
    "compiled_value_and_grad": lambda f, n: jaxaot.compiled_value_and_grad(f, argnums=n),
    "compiled_grad": lambda f, n: jaxaot.compiled_grad(f, argnums=n),
}


@pytest.mark.parametrize("argnums", [(), [], 1.0, True, "0", (0, None), (1, 1), [0, np.int64(0)], range(0)])
def test_every_gradient_refuses_the_same_argnums_when_built(argnums):
    """One reading of ``argnums`` for every gradient: the same value is refused by each, when built."""
    for who, make in _ALL_GRADIENTS.items():
        with pytest.raises(InvalidInputError, match="argnums"):
            make(_loss, argnums)


@pytest.mark.parametrize("argnums", [np.int64(1), range(2), [np.int32(0), -1], (1, 0), np.array([0, 1])], ids=str)
def test_every_gradient_reads_integer_argnums_as_jax_does(argnums):
    w, x = _args()
    want = jax.value_and_grad(_loss, argnums=argnums)(w, x)
    for who, make in _ALL_GRADIENTS.items():
        got = make(_loss, argnums)(w, x)
        if who.endswith("grad") and not who.endswith("value_and_grad"):
            assert_trees_close(got, want[1])
        else:
            assert_trees_close(got, want)
