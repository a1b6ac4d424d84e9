"""``jax.default_device``: uncommitted arrays run on the chosen device, committed ones where they live, as under
``jax.jit``, for every gradient entry point and in any order of calls (each placement compiles its own programs).
Needs two devices (eight CPU host devices under tests/conftest.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from zoo import assert_trees_close

pytestmark = pytest.mark.skipif(jax.device_count() < 2, reason="needs two devices to choose another default")


def _loss(w, x):
    return jnp.sum(jnp.tanh(x @ w) ** 2)


def _host_inputs():
    rng = np.random.default_rng()
    return rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=(3, 8)).astype(np.float32)


ENTRY_POINTS = {
    "fused": lambda: jaxaot.value_and_grad(jaxaot.aot_function(_loss)),
    "split": lambda: jaxaot.value_and_grad(jaxaot.aot_function(_loss), fused=False),
    "jax.value_and_grad": lambda: jax.value_and_grad(jaxaot.aot_function(_loss)),
    "compiled": lambda: jaxaot.compiled_value_and_grad(_loss),
    "compiled_replay": lambda: jaxaot.compiled_value_and_grad(_loss, replay=True),
}


@pytest.mark.parametrize("committed_first", [True, False], ids=["committed_first", "uncommitted_first"])
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_outputs_land_where_jit_s_do_under_another_default_device(entry, committed_first):
    first, other = jax.devices()[:2]
    wn, xn = _host_inputs()
    step = ENTRY_POINTS[entry]()
    committed = [jax.device_put(a, first) for a in (wn, xn)]  # on the first device, committed
    calls = [("committed", committed), ("uncommitted", None)]
    with jax.default_device(other):
        for name, args in calls if committed_first else calls[::-1]:
            args = args if args is not None else [jnp.asarray(a) for a in (wn, xn)]  # made on `other`
            want = jax.jit(jax.value_and_grad(_loss))(*args)
            got = step(*args)
            assert_trees_close(got, want, rtol=1e-5, atol=1e-6)
            assert [g.devices() for g in jax.tree.leaves(got)] == [w.devices() for w in jax.tree.leaves(want)], name
