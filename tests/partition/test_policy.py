"""remat_policy: the min-cut's plan as a jax.checkpoint policy, checked against JAX's own answers.

For each model and budget: gradients through ``jax.checkpoint(fn, policy=p)``
equal plain JAX's on fresh random inputs, and the residuals JAX saves under the
policy (JAX's ``saved_residuals``) are the plan's when ``p.exact``, and the
policy's own prediction, never lighter than the plan, when it approximates.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.ad_checkpoint import checkpoint_name

import jaxaot
from jaxaot._src import compat as C
from jaxaot.errors import InvalidInputError, InvalidValueError
from jaxaot._src.partition import RematPolicy, remat_policy, split_joint
from zoo import ZOO, assert_trees_close, mlp_gelu, transformer_args, transformer_block


# --------------------------------------------------------------------------- models
def _normal(rng, *shape, scale=1.0):
    return jnp.asarray(rng.standard_normal(shape, np.float32) * np.float32(scale))


def mlp_args(seed, dims=((16, 32), (32, 32), (32, 8))):
    rng = np.random.default_rng(seed)
    params = [(_normal(rng, i, o, scale=i**-0.5), _normal(rng, o, scale=0.1)) for i, o in dims]
    return (params, _normal(rng, 8, 16))


def tapered_mlp_args(seed):
    """Every layer a different width: no two values share a policy key."""
    return mlp_args(seed, dims=((16, 32), (32, 24), (24, 8)))


def block_args(seed):
    return transformer_args(batch=2, seq=8, width=16, seed=seed)


def conv_relu(x, w1, w2):
    dn = ("NHWC", "HWIO", "NHWC")
    y = jax.nn.relu(lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn))
    y = jax.nn.relu(lax.conv_general_dilated(y, w2, (1, 1), "SAME", dimension_numbers=dn))
    return jnp.mean(y**2)


def conv_args(seed):
    rng = np.random.default_rng(seed)
    return (_normal(rng, 2, 8, 8, 3), _normal(rng, 3, 3, 3, 4, scale=1 / 3), _normal(rng, 3, 3, 4, 4, scale=1 / 4))


def sin_cos_exp(x, w):
    h = jnp.sin(x @ w)
    h = jnp.exp(jnp.cos(h) * h)
    h = jnp.sin(h @ w) * jnp.cos(h)
    return jnp.sum(jnp.exp(-(h**2)))


def trig_args(seed):
    rng = np.random.default_rng(seed)
    return (_normal(rng, 16, 64), _normal(rng, 64, 64, scale=1 / 8))


MODELS = {
    "mlp_gelu": (mlp_gelu, mlp_args),
    "mlp_tapered": (mlp_gelu, tapered_mlp_args),
    "transformer_block": (transformer_block, block_args),
    "conv_relu": (conv_relu, conv_args),
    "sin_cos_exp": (sin_cos_exp, trig_args),
}
BUDGETS = (0.0, 0.5, 1.0)


# --------------------------------------------------------------------------- helpers
@functools.lru_cache(maxsize=None)
def _policy(name: str, budget: float) -> RematPolicy:
    fn, make_args = MODELS[name]
    return remat_policy(fn, *make_args(0), memory_budget=budget)


@functools.lru_cache(maxsize=None)
def _fresh(name: str) -> tuple:
    """Fresh random inputs (not the policy's example inputs) and plain JAX's answer on them."""
    fn, make_args = MODELS[name]
    args = make_args(1)
    return args, _reference(fn, args)


def _nbytes(aval) -> int:
    return int(np.prod(aval.shape)) * np.dtype(aval.dtype).itemsize


def _jax_saved(fn, args, policy) -> tuple[int, int]:
    """(count, bytes) of what JAX saves under ``policy`` that is not an argument."""
    res = [a for a, src in C.saved_residuals(jax.checkpoint(fn, policy=policy), *args)
           if not src.startswith("from the argument")]
    return len(res), sum(_nbytes(a) for a in res)


def _planned(fn, args, budget=None, partition_fn=None) -> tuple[int, int]:
    """(count, bytes) of the partition's non-input residuals."""
    joint = jaxaot.partition.trace_joint(fn, *args)
    partition = partition_fn or functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget)
    part = partition(joint)
    res = [r for r in part.residuals if r.source != "input"]
    return len(res), sum(r.nbytes for r in res)


def _reference(fn, args):
    """Plain JAX's value and gradients, computed on the host CPU: XLA's GPU compiler refuses the
    transformer block's gradient at these shapes (benchmarks/probes/xla_rank_mismatch.py)."""
    host = jax.devices("cpu")[0]
    return jax.jit(jax.value_and_grad(fn, argnums=tuple(range(len(args)))))(*jax.device_put(args, host))


def _check_gradients(fn, args, policy, want=None):
    """jax.jit(jax.value_and_grad(jax.checkpoint(fn, policy))) against jax.value_and_grad(fn); on the host CPU
    where XLA's GPU compiler refuses the program (benchmarks/probes/xla_rank_mismatch.py)."""
    argnums = tuple(range(len(args)))
    step = jax.jit(jax.value_and_grad(jax.checkpoint(fn, policy=policy), argnums=argnums))
    try:
        got = step(*args)
    except jax.errors.JaxRuntimeError as e:
        if "Shapes must be equal rank" not in str(e):
            raise
        got = step(*jax.device_put(args, jax.devices("cpu")[0]))
    want = _reference(fn, args) if want is None else want
    # float32 sums of products: an entry's error scales with the largest entry it was summed beside
    largest = max(float(jnp.max(jnp.abs(leaf))) for leaf in jax.tree.leaves(want))
    assert_trees_close(got, want, rtol=1e-4, atol=max(1e-5, 2e-6 * largest))


# --------------------------------------------------------------------------- the models
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_policy_reproduces_the_plan(name, budget):
    fn, make_args = MODELS[name]
    p = _policy(name, budget)
    args, want = _fresh(name)
    _check_gradients(fn, args, p, want)
    saved = _jax_saved(fn, args, p)
    planned = _planned(fn, args, budget)
    assert (p.planned_residuals, p.planned_bytes) == planned
    assert saved == (p.policy_residuals, p.policy_bytes), "the replay on the joint graph predicts JAX"
    if p.exact:
        assert saved == planned and p.approximations == ()
    else:
        assert p.approximations and saved[1] >= planned[1]
        assert all("the policy saves all" in a for a in p.approximations), p.approximations


def test_distinct_keys_are_exact_at_every_budget():
    # Two layers of one width share a key (mlp_gelu at 0.5 may save one and
    # recompute the other: approximate, and said so); here every layer has its own.
    assert all(_policy("mlp_tapered", b).exact for b in BUDGETS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_budget_zero_saves_only_what_jax_must(name):
    fn, make_args = MODELS[name]
    p = _policy(name, 0.0)
    args, _ = _fresh(name)
    assert p.exact and p.saved_keys == frozenset() and p.planned_bytes == 0
    everything = C.saved_residuals(jax.checkpoint(fn, policy=p), *args)
    nothing = C.saved_residuals(jax.checkpoint(fn, policy=jax.checkpoint_policies.nothing_saveable), *args)
    assert [(a.shape, a.dtype) for a, _ in everything] == [(a.shape, a.dtype) for a, _ in nothing]
    assert all(src.startswith("from the argument") for _, src in everything)


# --------------------------------------------------------------------------- approximations
def _two_tanh(x):
    a = jnp.tanh(x)
    return jnp.sum(jnp.tanh(a * 2.0))


def _save_first_tanh(joint):
    """A partition that saves the first tanh and recomputes the second one from it."""
    first = next(e for e in joint.eqns if e.primitive.name == "tanh")
    return split_joint(joint, first.outvars)


def test_mixed_decisions_on_one_key_save_them_all():
    x = _normal(np.random.default_rng(2), 32)
    p = remat_policy(_two_tanh, x, partition_fn=_save_first_tanh)
    assert not p.exact and p.memory_budget is None
    (note,) = p.approximations
    assert note.startswith("1 tanh eqn with key tanh(f32[32]) is saved and 1 recomputed; the policy saves all 2")
    assert p.describe() == ["tanh(f32[32])"]
    assert _jax_saved(_two_tanh, (x,), p) == (p.policy_residuals, p.policy_bytes) == (2, 256)
    planned = _planned(_two_tanh, (x,), partition_fn=_save_first_tanh)
    assert planned == (p.planned_residuals, p.planned_bytes) == (1, 128)
    _check_gradients(_two_tanh, (x,), p)


def test_values_only_the_backward_computes_are_reported():
    # The default partition saves rev(kernel), which jax.checkpoint computes in the backward.
    fn, make_args = MODELS["conv_relu"]
    args, want = _fresh("conv_relu")
    p = remat_policy(fn, *args, partition_fn=jaxaot.partition.default_partition)
    assert not p.exact and any("2 rev eqns" in a and "computes in the backward" in a for a in p.approximations)
    assert _jax_saved(fn, args, p) == (p.policy_residuals, p.policy_bytes)
    _check_gradients(fn, args, p, want)


def _spectral(w, x):
    r = jnp.fft.rfft(jnp.tanh(x @ w), axis=1)  # a complex intermediate the plan saves
    return jnp.sum(jnp.fft.irfft(r ** 2, n=x.shape[1], axis=1) @ w)


def test_complex_values_the_plan_saves_are_recomputed_by_the_policy():
    """jax.checkpoint cannot save a complex residual (its ``reduce_precision`` refuses complex dtypes): the policy
    recomputes it and says so, and runs."""
    rng = np.random.default_rng()
    w, x = _normal(rng, 32, 32) / 6, _normal(rng, 16, 32)
    p = remat_policy(_spectral, w, x, memory_budget=1.0)
    assert not p.exact and any("complex outputs of 1 fft eqn" in a for a in p.approximations), p.approximations
    _check_gradients(_spectral, (w, x), p)


def _dropout_scan(ws, x, key):
    def body(carry, w):
        h, k = carry
        k, sub = jax.random.split(k)
        h = jnp.tanh(h @ w)
        return (jnp.where(jax.random.bernoulli(sub, 0.7, h.shape), h / 0.7, 0.0), k), None

    (h, _), _ = lax.scan(body, (x, key), ws)
    return jnp.sum(h ** 2)


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_a_typed_key_the_plan_carries_through_a_scan_gets_a_policy(impl):
    rng = np.random.default_rng()
    ws, x = _normal(rng, 3, 8, 8) / 3, _normal(rng, 4, 8)
    key = jax.random.key(int(rng.integers(1 << 30)), impl=impl)
    p = remat_policy(_dropout_scan, ws, x, key, memory_budget=0.3)
    grads = jax.grad(jax.checkpoint(_dropout_scan, policy=p), argnums=(0, 1))(ws, x, key)
    assert_trees_close(grads, jax.grad(_dropout_scan, argnums=(0, 1))(ws, x, key), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("zoo_name", ["scan", "cond", "checkpoint"])
def test_bodies_the_plan_does_not_decide_make_it_approximate(zoo_name):
    fn, make_args = ZOO[zoo_name]
    loss = lambda *a: sum(jnp.sum(o) for o in jax.tree_util.tree_leaves(fn(*a)))  # noqa: E731
    p = remat_policy(loss, *make_args(jax.random.key(0)))
    name = {"scan": "scan", "cond": "cond", "checkpoint": "jax.checkpoint"}[zoo_name]
    assert not p.exact and p.policy_bytes is None
    assert any(f"1 {name} eqn" in a for a in p.approximations), p.approximations
    _check_gradients(loss, make_args(jax.random.key(3)), p)


def test_named_values_are_told_apart_by_name():
    def fn(x):
        a = checkpoint_name(jnp.sin(x), "a")
        b = checkpoint_name(jnp.sin(x * 3.0), "b")
        return jnp.sum(a * b)

    x = _normal(np.random.default_rng(4), 16)
    def pick(joint):  # save x and the value named "a"
        named = [e.outvars[0] for e in joint.eqns if e.params.get("name") == "a"]
        return split_joint(joint, [*C.jaxpr_of(joint.jaxpr).invars[: joint.num_primals], *named])

    p = remat_policy(fn, x, partition_fn=pick)
    assert p.exact and p.describe() == ["name(f32[16])"]
    assert _jax_saved(fn, (x,), p) == (1, 64)
    _check_gradients(fn, (x,), p)


# --------------------------------------------------------------------------- the object and bad inputs
@pytest.mark.smoke
def test_policy_object():
    p = _policy("mlp_gelu", 1.0)
    assert hash(p) == hash(_policy("mlp_gelu", 1.0)) and p.memory_budget == 1.0
    with pytest.raises(AttributeError):
        p.exact = False  # frozen
    assert repr(p).startswith("RematPolicy(memory_budget=1.0, exact=True, saves [add(f32[8,32], f32[1,32]), ")
    assert f"plan: 3 values, {p.planned_bytes} B; under the policy: 3 values" in repr(p)
    sin_aval = jax.core.ShapedArray((3,), jnp.float32)
    assert p(lax.sin_p, sin_aval) is False
    both = jax.checkpoint_policies.save_from_both_policies(p, jax.checkpoint_policies.nothing_saveable)
    fn, make_args = MODELS["mlp_gelu"]
    args, _ = _fresh("mlp_gelu")
    assert _jax_saved(fn, args, both) == _jax_saved(fn, args, p)


def test_keyword_example_arguments():
    fn = lambda x, *, w: jnp.sum(jnp.tanh(x @ w))  # noqa: E731
    x, w = jnp.ones((4, 8)), jnp.ones((8, 8)) / 8
    p = remat_policy(fn, x, w=w, memory_budget=np.float32(0.5))
    assert p.exact and p.memory_budget == 0.5 and jax.grad(jax.checkpoint(fn, policy=p))(x, w=w).shape == (4, 8)


@pytest.mark.parametrize("budget", [-0.1, 1.5, float("nan"), float("inf"), "high"])
def test_budgets_that_mean_neither_a_fraction_nor_bytes(budget):
    with pytest.raises(InvalidValueError, match="memory_budget"):
        remat_policy(jnp.sin, jnp.ones(3), memory_budget=budget)


@pytest.mark.parametrize("kwargs, match", [
    (dict(memory_budget=True), "memory_budget"),
    (dict(memory_budget=None), "memory_budget"),
    (dict(partition_fn=3), "partition_fn"),
    (dict(partition_fn=jaxaot.partition.default_partition, memory_budget=0.5), "not both"),
    (dict(partition_fn=lambda joint: "a partition"), "not a jaxaot Partition"),
])
def test_bad_options(kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        remat_policy(lambda x: jnp.sum(jnp.sin(x)), jnp.ones(3), **kwargs)


def test_not_callable():
    with pytest.raises(InvalidInputError, match="callable"):
        remat_policy("not a function", jnp.ones(3))


def test_a_plan_with_offloaded_residuals_exports_as_a_policy():
    """Offloaded residuals are saved values to a checkpoint policy (JAX keeps them on the device)."""
    from jaxaot._src.partition import DeviceModel

    def fn(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x ** 2)

    ks = jax.random.split(jax.random.key(np.random.randint(1 << 20)), 4)
    # Large enough to offload (values under 64 KiB stay on the device).
    ws, x = [jax.random.normal(k, (128, 128)) / 11 for k in ks[:3]], jax.random.normal(ks[3], (512, 128))
    fast = DeviceModel(host_bandwidth=1e12, device_flops=1e12)
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, offload=True, device_model=fast)
    assert any(r.offloaded for r in pf(jaxaot.partition.trace_joint(fn, ws, x)).residuals)
    p = jaxaot.partition.remat_policy(fn, ws, x, partition_fn=pf)
    got = jax.jit(jax.value_and_grad(jax.checkpoint(fn, policy=p)))(ws, x)
    assert_trees_close(got, jax.value_and_grad(fn)(ws, x), rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- offloading, exported
def _widening_mlp(params, x):
    for w in params:
        x = jax.nn.gelu(x @ w)
    return jnp.mean(x ** 2)


def _widening_args(seed=3):
    widths = [256, 288, 320, 352, 384, 416, 448]
    ks = jax.random.split(jax.random.key(seed), len(widths))
    return [jax.random.normal(k, (a, b)) / 16 for k, a, b in zip(ks, widths[:-1], widths[1:])], \
        jax.random.normal(ks[-1], (256, 256))


@pytest.mark.parametrize("budget", [1.0, 0.5])
def test_offloading_plan_exports_as_offloadable_answers(budget):
    from jaxaot._src.partition import DeviceModel
    link = DeviceModel(host_bandwidth=2e10, device_flops=1e12)  # synthetic: the CPU has no separate host memory
    args = _widening_args()
    part = jaxaot.partition.min_cut_rematerialization_partition(jaxaot.partition.trace_joint(_widening_mlp, *args), memory_budget=budget,
                                                      offload=True, device_model=link)
    p = remat_policy(_widening_mlp, *args, memory_budget=budget, offload=True, device_model=link)
    assert p.exact and p.offloaded_keys and p.offloaded_keys <= p.saved_keys
    out, res = jax.fwd_and_bwd(jax.checkpoint(_widening_mlp, policy=p), argnums=(0, 1))[0](*args)
    host = sum(r.nbytes for r in jax.tree_util.tree_leaves(res) if "host" in str(r.sharding.memory_kind))
    device = sum(r.nbytes for r in jax.tree_util.tree_leaves(res)) - host
    assert host == sum(r.nbytes for r in part.residuals if r.offloaded) > 0
    assert device == part.device_saved_bytes
    fresh = _widening_args(seed=8)
    assert_trees_close(jax.jit(jax.grad(jax.checkpoint(_widening_mlp, policy=p)))(*fresh),
                       jax.grad(_widening_mlp)(*fresh), rtol=1e-5, atol=1e-6)


def test_shared_keys_of_offloaded_and_device_values_keep_them_on_the_device():
    from jaxaot._src.partition import DeviceModel
    link = DeviceModel(host_bandwidth=2e10, device_flops=1e12)
    ks = jax.random.split(jax.random.key(4), 7)
    params, x = [jax.random.normal(k, (256, 256)) / 16 for k in ks[:-1]], jax.random.normal(ks[-1], (256, 256))
    p = remat_policy(_widening_mlp, params, x, offload=True, device_model=link)
    assert not p.exact and not p.offloaded_keys
    assert any("offloaded" in a for a in p.approximations)
