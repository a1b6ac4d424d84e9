"""A leaf that is not an array is named where the user wrote it, with the remedy for where it is: an input by its
position in the call (static arguments counted, never named themselves), a Python value inside a pytree argument
with the advice to hold an array there or make the whole argument static, and an output by its path in what the
function returns, with the advice to return arrays (a compiled program returns arrays only, as under ``jax.jit``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot.errors import InvalidInputError, InvalidOutputError

X = jnp.ones(3)


def _mode_x_d(mode, x, d):
    return jnp.sum(x * 2)


def _x_d_mode(x, d, mode):
    return jnp.sum(x * 2)


def _calls(f, *args, **kwargs):
    return (lambda: f(*args, **kwargs), lambda: jaxaot.value_and_grad(f)(*args, **kwargs),
            lambda: jax.grad(f, argnums=1)(*args, **kwargs) if not kwargs else f.forward(*args, **kwargs),
            lambda: f.lower(*args, **kwargs))


@pytest.mark.parametrize("make,args,kwargs,where,arg", [
    (lambda: jaxaot.aot_function(_mode_x_d, static_argnums=0), ("fast", X, {"tag": "oops"}), {},
     r"arg\[2\]\['tag'\]", r"arg\[2\]"),
    (lambda: jaxaot.aot_function(_x_d_mode, static_argnums=2), (X, {"tag": "oops"}), {"mode": "fast"},
     r"arg\[1\]\['tag'\]", r"arg\[1\]"),
    (lambda: jaxaot.aot_function(_mode_x_d), (X, X, {"tag": [X, "oops"]}), {},
     r"arg\[2\]\['tag'\]\[1\]", r"arg\[2\]"),
    (lambda: jaxaot.aot_function(_mode_x_d, static_argnums=0), ("fast", X), {"d": {"tag": "oops"}},
     r"kwarg\['d'\]\['tag'\]", r"kwarg\['d'\]"),
])
def test_a_python_value_inside_a_pytree_argument_is_named_by_its_path(make, args, kwargs, where, arg):
    f = make()
    for call in _calls(f, *args, **kwargs):
        with pytest.raises(InvalidInputError, match=rf"^{where} is a str inside the pytree argument {arg}, not an "
                                                    r"array or scalar\. .*hold an array there \(jnp\.asarray\).* "
                                                    rf"make all of {arg} a static argument \(static_argnums; it "
                                                    r"must then be hashable") as err:
            call()
        assert "arg[0]" not in str(err.value)


def test_a_whole_argument_that_is_a_python_value_is_advised_to_be_static():
    f = jaxaot.aot_function(_mode_x_d, static_argnums=0)
    for call in _calls(f, "fast", X, "oops"):
        with pytest.raises(InvalidInputError, match=r"^arg\[2\] is a str, not an array or scalar\. .*pass it as a "
                                                    r"static argument \(static_argnums\)"):
            call()


@pytest.mark.parametrize("fn,where", [
    (lambda x: {"y": jnp.sin(x), "tag": "done"}, r"output\['tag'\]"),
    (lambda x: (jnp.sin(x), ["done"]), r"output\[1\]\[0\]"),
])
def test_a_python_output_is_named_by_its_path_with_the_advice_for_outputs(fn, where):
    f = jaxaot.aot_function(fn)
    for call in (lambda: f(X), lambda: f.lower(X), lambda: f.forward(X)):
        with pytest.raises(InvalidOutputError, match=rf"^{where} is a str, not an array or scalar\. A compiled "
                                                     r"program returns arrays only, as under jax\.jit: return it as "
                                                     r"an array \(jnp\.asarray\)") as err:
            call()
        assert "static_argnums" not in str(err.value)
