"""An error in the user's own function shows the user's lines, as under ``jax.jit``: jaxaot's frames are filtered
out of the traceback with JAX's (``JAX_TRACEBACK_FILTERING``), its type and message untouched."""

from __future__ import annotations

import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot

PACKAGE = str(Path(jaxaot.__file__).resolve().parent)


def _loss(w, x):
    y = jnp.tanh(x @ w)
    if y.shape[0] == 5:
        raise ValueError("the user's own bug")
    return jnp.sum(y)


ENTRY_POINTS = {
    "aot_function": lambda: jaxaot.aot_function(_loss),
    "value_and_grad": lambda: jaxaot.value_and_grad(jaxaot.aot_function(_loss)),
    "grad of a plain function": lambda: jaxaot.grad(_loss),
    "compiled_value_and_grad": lambda: jaxaot.compiled_value_and_grad(_loss),
    "jax.jit": lambda: jax.jit(_loss),
}


def _frames(call):
    with pytest.raises(ValueError, match="the user's own bug") as err:
        call()
    return [f.filename for f in traceback.extract_tb(err.value.__traceback__)]


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_user_error_shows_the_user_s_lines_and_no_jaxaot_frames(entry):
    rng = np.random.default_rng()
    w, x = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((3, 2), (5, 3)))
    fn = ENTRY_POINTS[entry]()
    frames = _frames(lambda: fn(w, x))
    assert frames[-1] == __file__ and not any(f.startswith(PACKAGE) for f in frames), frames
    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", "off")  # every frame kept, jaxaot's too (for a bug report)
    try:
        unfiltered = _frames(lambda: ENTRY_POINTS[entry]()(w, x))
    finally:
        jax.config.update("jax_traceback_filtering", before)
    assert unfiltered[-1] == __file__
    assert entry == "jax.jit" or any(f.startswith(PACKAGE) for f in unfiltered)
    fn(w, x[:4])  # the function keeps working
