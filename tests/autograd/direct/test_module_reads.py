"""``jaxaot.value_and_grad`` of a loss of modules behaves as ``nnx.value_and_grad``: modules held in a list, tuple
or dict are found as Flax's graph traversal finds them, and the globals a loss reads (NumPy arrays written in
place, a config object's attributes) are read at each call. Each against plain ``flax.nnx`` on random inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxaot
from zoo import normal_at, trees_close


def _x(seed: int, shape=(4, 2)):
    return normal_at(seed, shape)


def _pure(tree):
    return jax.tree.map(lambda s: nnx.to_pure_dict(s), tree, is_leaf=lambda s: isinstance(s, nnx.State))


def _layers(wrap: bool):
    bn = nnx.BatchNorm(2, rngs=nnx.Rngs(0))
    return [jaxaot.nn.aot_module(bn) if wrap else bn, nnx.Linear(2, 2, rngs=nnx.Rngs(1))]


def _as(kind: str, layers: list):
    return {"list": list, "tuple": tuple, "dict": lambda ls: {"norm": ls[0], "dense": ls[1]}}[kind](layers)


def _loss(ms, x):
    first, second = (ms["norm"], ms["dense"]) if isinstance(ms, dict) else ms
    return jnp.sum(second(first(x)) ** 2)


@pytest.mark.parametrize("kind", ["list", "tuple", "dict"])
@pytest.mark.parametrize("wrap", [False, True], ids=["plain", "with_aot_module"])
@pytest.mark.parametrize("argnums", [0, (0,)])
def test_modules_in_a_container_are_differentiated_as_nnx_does(kind, wrap, argnums):
    plain, ours = _as(kind, _layers(False)), _as(kind, _layers(wrap))
    for seed in (1, 2):
        x = _x(seed)
        loss_e, grads_e = nnx.value_and_grad(_loss, argnums=argnums)(plain, x)
        loss_a, grads_a = jaxaot.value_and_grad(_loss, argnums=argnums)(ours, x)
        assert trees_close(loss_e, loss_a)
        assert jax.tree.structure(grads_e, is_leaf=lambda s: isinstance(s, nnx.State)) == jax.tree.structure(
            grads_a, is_leaf=lambda s: isinstance(s, nnx.State))
        assert trees_close(_pure(grads_e), _pure(grads_a))
        assert trees_close(nnx.to_pure_dict(nnx.state(plain)), nnx.to_pure_dict(nnx.state(ours)))  # batch statistics


def test_a_container_of_arrays_is_still_jaxs():
    params = [jnp.ones((2, 2)), {"b": jnp.zeros(2)}]
    loss = lambda p, x: jnp.sum((x @ p[0] + p[1]["b"]) ** 2)  # noqa: E731
    x = _x(3)
    assert trees_close(jaxaot.value_and_grad(loss)(params, x), jax.value_and_grad(loss)(params, x))


# --------------------------------------------------------------------------- globals read at each call
W_NP = np.ones(2, np.float32)
BIG_NP = np.ones(300_000, np.float32)  # over 1 MiB: read by identity


class Options:
    pass


OPTIONS = Options()
OPTIONS.scale = 1.0
OPTIONS.mode = "sq"


def _global_loss(m, x):
    y = m(x) * W_NP * OPTIONS.scale
    return jnp.sum(y ** 2) if OPTIONS.mode == "sq" else jnp.sum(jnp.abs(y))


def _compare(plain, wrapped, seed, loss=_global_loss):
    x = _x(seed, (4, 8))
    loss_e, grads_e = nnx.value_and_grad(loss)(plain, x)
    loss_a, grads_a = jaxaot.value_and_grad(loss)(wrapped, x)
    assert trees_close(loss_e, loss_a, atol=1e-4) and trees_close(nnx.to_pure_dict(grads_e), nnx.to_pure_dict(grads_a))


def test_a_numpy_global_written_in_place_and_a_config_objects_attributes_are_read_at_each_call():
    plain = nnx.Linear(8, 2, rngs=nnx.Rngs(0))
    wrapped = jaxaot.nn.aot_module(nnx.Linear(8, 2, rngs=nnx.Rngs(0)))
    try:
        _compare(plain, wrapped, 10)
        W_NP[:] = 3.0
        _compare(plain, wrapped, 11)
        OPTIONS.scale = 2.0
        _compare(plain, wrapped, 12)
        OPTIONS.mode = "abs"
        _compare(plain, wrapped, 13)
        W_NP[0], OPTIONS.scale, OPTIONS.mode = 1.0, 1.0, "sq"
        _compare(plain, wrapped, 14)
        misses = wrapped.cache_info().misses
        W_NP[0] = 3.0
        _compare(plain, wrapped, 15)  # contents seen before (the second call's): their program runs again
        assert wrapped.cache_info().misses == misses
    finally:
        W_NP[:], OPTIONS.scale, OPTIONS.mode = 1.0, 1.0, "sq"


def _big_loss(m, x):
    return jnp.sum(m(x)) * float(BIG_NP[0])


def test_a_numpy_global_over_one_mebibyte_is_read_by_identity():
    wrapped = jaxaot.nn.aot_module(nnx.Linear(8, 2, rngs=nnx.Rngs(0)))
    x = _x(20, (4, 8))
    first = jaxaot.value_and_grad(_big_loss)(wrapped, x)[0]
    try:
        BIG_NP[0] = 5.0  # written in place: unseen, as documented
        assert trees_close(jaxaot.value_and_grad(_big_loss)(wrapped, x)[0], first)
    finally:
        BIG_NP[0] = 1.0


WEIGHTS = {"loss": 1.0}


def _weighted(h):
    return h * WEIGHTS["loss"]  # a helper of the loss reads the global, not the loss itself


def _scaled_twice(h):
    return _weighted(h) * 2.0


def _helper_loss(m, x):
    return jnp.sum(_scaled_twice(m(x)))


def test_what_the_users_helper_functions_read_is_read_at_each_call():
    plain = nnx.Linear(8, 2, rngs=nnx.Rngs(0))
    wrapped = jaxaot.nn.aot_module(nnx.Linear(8, 2, rngs=nnx.Rngs(0)))
    try:
        for seed, weight in ((20, 1.0), (21, 2.0), (22, 3.0)):
            WEIGHTS["loss"] = weight
            _compare(plain, wrapped, seed, loss=_helper_loss)
    finally:
        WEIGHTS["loss"] = 1.0


class _Gated(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(8, 2, rngs=nnx.Rngs(0))

    def __call__(self, x, deterministic=False):
        return self.lin(x) * (1.0 if deterministic else 2.0)


def _gated_loss(m, x, det):
    return jnp.sum(m(x, deterministic=det)) * WEIGHTS["loss"]


def test_a_recompile_reason_names_the_python_value_or_global_that_changed():
    wrapped = jaxaot.nn.aot_module(_Gated())
    vg = jaxaot.value_and_grad(_gated_loss)
    try:
        for det, weight in ((False, 1.0), (True, 1.0), (True, 2.0)):
            WEIGHTS["loss"] = weight
            x = _x(30, (4, 8))
            got = vg(wrapped, x, det)
            assert trees_close(got[0], nnx.value_and_grad(_gated_loss)(wrapped, x, det)[0])
    finally:
        WEIGHTS["loss"] = 1.0
    reasons = [e.reason for e in vg.cache_info().entries]
    assert reasons == ["first call", "_gated_loss's argument det: False → True",
                       "what _gated_loss reads changed: WEIGHTS"]
