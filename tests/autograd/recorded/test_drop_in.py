"""``compiled_value_and_grad`` behaves as ``jax.value_and_grad`` where JAX's own rules decide, or raises.

A NumPy scalar is typed as JAX types it (not as the Python number of equal value), arrays on another device
run there (arrays the forward closes over too; arguments on two devices raise a ``ValueError``),
``jax.debug_nans`` raises ``FloatingPointError`` (never JAX's internal error, and the function keeps its mode),
``argnums`` naming an argument twice is refused, and ``cache_info()`` stays bounded; each with replay and
without, on fresh random inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from autograd_helpers import close as _close, rand as _rand
from jaxaot import compiled_autograd
from jaxaot.errors import InvalidInputError

REPLAY = pytest.mark.parametrize("replay", [False, True])


@REPLAY
def test_a_numpy_scalar_is_typed_as_jax_types_it_not_as_the_python_number(replay):
    def f(w, n):
        return jnp.sum(w * n) / n

    w = _rand(np.random.default_rng(), 3).astype(jnp.float16)
    vg = jaxaot.compiled_value_and_grad(f, replay=replay)
    for n in (1e5, np.float64(1e5), 1e5, np.float32(3.0), 3.0):  # equal values, other types: JAX's promotion
        value, grad = vg(w, n)
        want_value, want_grad = jax.value_and_grad(f)(w, n)
        assert value.dtype == want_value.dtype and grad.dtype == want_grad.dtype, n
        _close((value, grad), (want_value, want_grad), tol=2e-3)  # float16 gradients; NaN where JAX's is


def _loss(w, x):
    y = jnp.tanh(x @ w)
    if float(jnp.sum(y)) > 0:  # Python looks at a value: a program of its own computes it
        y = 2 * y
    return jnp.sum(y ** 2)


def _reference(w, x):
    scale = 2.0 if float(jnp.sum(jnp.tanh(x @ w))) > 0 else 1.0
    return jax.value_and_grad(lambda w, x: jnp.sum((scale * jnp.tanh(x @ w)) ** 2))(w, x)


@REPLAY
def test_arrays_on_another_device_run_there(replay):
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count=2 on a CPU)")
    rng = np.random.default_rng()
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
    d0, d1 = jax.devices()[:2]
    vg = jaxaot.compiled_value_and_grad(_loss, replay=replay)
    for d in (d0, d1, d0, d1, None):
        args = (w + 0, x + 0) if d is None else (jax.device_put(w, d), jax.device_put(x, d))
        value, grad = vg(*args)
        _close((value, grad), _reference(*args))
        assert grad.devices() == args[0].devices() and value.devices() == args[0].devices()
    assert not compiled_autograd.stats().fallbacks  # the function kept its lazy recording


@REPLAY
def test_an_array_the_forward_closes_over_runs_where_it_lives(replay):
    """Its placement keys the step and the program of a value Python looks at, as the arguments' does: moved
    between calls, or held by two functions of one code, each compiles its own, and runs where eager JAX does."""
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count=2 on a CPU)")
    rng = np.random.default_rng()
    w, x, c = _rand(rng, 3, 2), _rand(rng, 4, 3), _rand(rng, 4, 2)
    d0, d1 = jax.devices()[:2]
    held = {"c": c}

    def loss(w, x, scale=None):
        y = jnp.tanh(x @ w) * held["c"]
        if scale is None:  # Python looks at a value (eager JAX's reference is given the branch it takes)
            scale = 2.0 if float(jnp.sum(y)) > 0 else 1.0
        return jnp.sum((scale * y) ** 2)

    vg = jaxaot.compiled_value_and_grad(loss, replay=replay)
    for where in (None, d1, d0, d1, None):
        held["c"] = c + 0 if where is None else jax.device_put(c, where)
        scale = 2.0 if float(jnp.sum(jnp.tanh(x @ w) * held["c"])) > 0 else 1.0
        got, want = vg(w, x), jax.value_and_grad(loss)(w, x, scale)
        _close(got, want)
        assert got[1].devices() == want[1].devices(), where
    assert "on other devices" in vg.cache_info().entries[-1].reason

    def make(c):
        return lambda w, x: jnp.sum(jnp.tanh(x @ w) * c)

    for c_at in (c + 0, jax.device_put(c, d1)):  # one code, two closures: executables are shared by structure
        f = make(c_at)
        got, want = jaxaot.compiled_value_and_grad(f, replay=replay)(w, x), jax.value_and_grad(f)(w, x)
        _close(got, want)
        assert got[1].devices() == want[1].devices()


@REPLAY
def test_arguments_on_different_devices_raise_a_value_error_naming_them(replay):
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count=2 on a CPU)")
    rng = np.random.default_rng()
    d0, d1 = jax.devices()[:2]
    w, x = jax.device_put(_rand(rng, 3, 2), d0), jax.device_put(_rand(rng, 4, 3), d1)
    with pytest.raises(ValueError):
        jax.value_and_grad(_loss)(w, x)
    vg = jaxaot.compiled_value_and_grad(_loss, replay=replay)
    with pytest.raises(jaxaot.errors.ShardingMismatchError, match=r"different devices .*jax.device_put"):
        vg(w, x)  # Python looks at a value: the operations before it run eagerly and meet the two devices
    x = jax.device_put(x, d0)
    _close(vg(w, x), _reference(w, x))  # and the function keeps working


@REPLAY
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_debug_nans_raises_floating_point_error_and_the_function_keeps_its_mode(replay, where):
    f, w = ((lambda w: jnp.sum(jnp.log(w))), -jnp.ones(3)) if where == "forward" else (
        (lambda w: jnp.sum(jnp.sqrt(w) * 0.0)), jnp.zeros(3))
    vg = jaxaot.compiled_value_and_grad(f, replay=replay)
    vg(w), vg(w)  # recorded (and replayable)
    with jax.debug_nans(True):
        with pytest.raises(FloatingPointError):
            jax.value_and_grad(f)(w)
        with pytest.raises(FloatingPointError, match="invalid value"):
            vg(w)
    assert not compiled_autograd.stats().fallbacks
    fine = jnp.abs(_rand(np.random.default_rng(), 3)) + 1
    _close(vg(fine), jax.value_and_grad(f)(fine))


@REPLAY
@pytest.mark.parametrize("look", [False, True])
def test_a_change_of_jax_configuration_compiles_again_as_jit_does(replay, look):
    """A setting lowering reads (``jax_threefry_partitionable`` picks the random bits) keys every program of the
    step, the looked-at value's too: after a change the step gives eager JAX's numbers, and the reason says why."""
    def loss(w, key):
        mask = jax.random.uniform(key, w.shape)
        if look and float(jnp.sum(mask)) < 0:  # never true: a look whose program draws the bits too
            mask = -mask
        return jnp.sum(jnp.tanh(w * mask) ** 2)

    rng = np.random.default_rng()
    w, key = _rand(rng, 8, 8), jax.random.key(int(rng.integers(1 << 30)))
    vg = jaxaot.compiled_value_and_grad(loss, replay=replay)
    before = jax.config.jax_threefry_partitionable
    try:
        for setting in (before, not before, before, not before):
            jax.config.update("jax_threefry_partitionable", setting)
            _close(vg(w, key), jax.value_and_grad(loss)(w, key), tol=1e-5)
    finally:
        jax.config.update("jax_threefry_partitionable", before)
    info = vg.cache_info()
    assert info.misses == 2, info  # one program per setting, each found again
    assert "JAX's configuration changed" in info.entries[-1].reason


@pytest.mark.parametrize("make", [lambda f, n: jaxaot.compiled_value_and_grad(f, argnums=n),
                                  lambda f, n: jaxaot.value_and_grad(jaxaot.aot_function(f), argnums=n)])
def test_argnums_naming_an_argument_twice_is_refused(make):
    def f(a, b):
        return jnp.sum(a * b ** 2)

    rng = np.random.default_rng()
    a, b = _rand(rng, 3), _rand(rng, 3)
    with pytest.raises(InvalidInputError, match=r"names argument 1 more than once"):
        make(f, (1, -1))(a, b)
    _close(make(f, (0, 1))(a, b), jax.value_and_grad(f, argnums=(0, 1))(a, b))


def test_cache_info_keeps_the_latest_entries_and_counts_them_all():
    from jaxaot._src.autograd.recorded.plans import MAX_INFO_ENTRIES

    def f(w):
        loss = jnp.sum(w ** 2)
        return loss * 0.0 if float(loss) > 1e9 else loss  # a float Python reads, another every step

    vg = jaxaot.compiled_value_and_grad(f, replay=True)
    w = _rand(np.random.default_rng(), 3)
    calls = MAX_INFO_ENTRIES + 20
    for _ in range(calls):  # a training loop: each step records again, its looked-at value new
        _, grad = vg(w)
        w = w - 1e-3 * grad
    info = vg.cache_info()
    assert len(info.entries) == MAX_INFO_ENTRIES and info.misses + info.hits == calls and info.misses > calls // 2


def test_holomorphic_and_allow_int_are_jax_s():
    rng = np.random.default_rng()
    z = jnp.asarray(rng.normal(size=3) + 1j * rng.normal(size=3), jnp.complex64)
    f = lambda z: jnp.sum(jnp.sin(z) ** 2)  # noqa: E731
    _close(jaxaot.compiled_value_and_grad(f, holomorphic=True)(z), jax.value_and_grad(f, holomorphic=True)(z))
    g = lambda w, n: jnp.sum(w * n)  # noqa: E731
    w, n = _rand(rng, 3), jnp.arange(3)
    got = jaxaot.compiled_grad(g, argnums=(0, 1), allow_int=True)(w, n)
    want = jax.grad(g, argnums=(0, 1), allow_int=True)(w, n)
    _close(got[0], want[0])
    assert got[1].dtype == want[1].dtype and got[1].shape == want[1].shape
    with pytest.raises(InvalidInputError, match="replay"):
        jaxaot.compiled_value_and_grad(f, holomorphic=True, replay=True)


@REPLAY
def test_a_value_kept_beyond_the_call_is_a_recorded_value_and_the_aux_returns_it_computed(replay):
    """A value the forward stores away is a recorded value (``docs/concepts/compiled_autograd.md``): used after
    the call it raises JAX's ``UnexpectedTracerError``, never a wrong number; returned as aux it is computed."""
    kept = []

    def loss(w, x):
        feats = jnp.sin(x) * 2.0  # independent of w: a concrete array under eager jax.value_and_grad
        kept.append(feats)
        return jnp.sum(w * feats), feats

    rng = np.random.default_rng()
    w, x = _rand(rng, 3), _rand(rng, 3)
    (value, aux), grad = jaxaot.compiled_value_and_grad(loss, has_aux=True, replay=replay)(w, x)
    _close(((value, aux), grad), jax.value_and_grad(loss, has_aux=True)(w, x))
    with pytest.raises(jax.errors.UnexpectedTracerError):
        kept[0] + 1.0
