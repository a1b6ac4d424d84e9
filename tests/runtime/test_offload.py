"""Offloaded residuals end to end on this CPU backend: split and fused programs, lower(), meshes.

jax 0.10.2's CPU backend has the ``pinned_host`` and ``unpinned_host`` memory
kinds and runs ``jax.device_put`` to them inside ``jit``, so the offloaded
programs run here for real (the copies are host-to-host: correct, not faster).
``DeviceModel.measure()`` still reports no host memory on CPU, where an
offloaded copy would free nothing: ``offload="auto"`` offloads nothing and
``lower()`` says why. A synthetic :class:`DeviceModel` forces offloading.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxaot
from jaxaot._src.fusion import fused_program
from jaxaot._src.partition import DeviceModel
from jaxaot._src.partition import min_cut_rematerialization_partition as mincut
import zoo
from zoo import assert_trees_close, deep_mlp, kept_step

# A host link fast enough that both models offload at budgets 1 and 0.5 (at 5 GB/s the
# attention block's budget 0.5 is met by recomputing alone, and then nothing is offloaded).
MID = DeviceModel(host_bandwidth=2e10, device_flops=1e12)
TOL = dict(rtol=1e-5, atol=1e-6)
on_cpu = pytest.mark.skipif(jax.devices()[0].platform != "cpu", reason="what the CPU backend does")


deep_mlp_args = functools.partial(zoo.deep_mlp_args, layers=6, seed=3)


def attention_block(p, x):
    q, k, v = (x @ p["q"], x @ p["k"], x @ p["v"])
    a = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k) / 8.0, axis=-1)
    h = x + jnp.einsum("bqk,bkd->bqd", a, v) @ p["o"]
    return jnp.mean(jax.nn.gelu(h @ p["up"]) ** 2)


def attention_args(batch=4, seq=128, width=64):
    ks = jax.random.split(jax.random.key(4), 6)
    p = {name: jax.random.normal(k, (width, 4 * width if name == "up" else width)) / 8
         for name, k in zip(("q", "k", "v", "o", "up"), ks[:5])}
    return p, jax.random.normal(ks[5], (batch, seq, width))


MODELS = {"deep_mlp": (deep_mlp, deep_mlp_args), "attention_block": (attention_block, attention_args)}


def offloading(fn, budget=1.0, **kw):
    return jaxaot.aot_function(fn, partition_fn=functools.partial(
        mincut, memory_budget=budget, offload=True, device_model=MID), **kw)


@on_cpu
def test_what_this_cpu_backend_supports():
    device = jax.devices()[0]
    kinds = {m.kind for m in device.addressable_memories()}
    assert device.platform == "cpu" and {"device", "pinned_host"} <= kinds
    moved = jax.jit(lambda x: jax.device_put(x * 2, jax.memory.Space.Host))(jnp.ones(4))
    assert moved.sharding.memory_kind == "pinned_host"
    model = DeviceModel.measure()
    assert not model.has_host_memory and "cpu" in model.note
    assert model.host_bandwidth > 0 and model.device_flops > 0


@pytest.mark.parametrize("budget", [1.0, 0.5])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_split_gradients_equal_jax_grad(name, budget):
    fn, make_args = MODELS[name]
    args = make_args()
    f = offloading(fn, budget)
    low = f.lower(*args)
    assert any(r.offloaded for r in low.saved)
    want = jax.grad(fn)(*args)
    assert_trees_close(jax.grad(f)(*args), want, **TOL)
    assert_trees_close(jax.jit(jax.grad(f))(*args), want, **TOL)
    assert_trees_close(jaxaot.grad(f, fused=False)(*args), want, **TOL)


def test_explicit_forward_backward_keep_offloaded_residuals_in_host_memory():
    args = deep_mlp_args()
    f = offloading(deep_mlp)
    out, res = f.forward(*args)
    kinds = [a.sharding.memory_kind for a in res.arrays]
    assert kinds == ["pinned_host" if r.offloaded else "device" for r in res.residuals]
    assert "pinned_host" in kinds
    grads = f.backward(res, jnp.float32(1))
    assert_trees_close(grads, jax.grad(deep_mlp, argnums=(0, 1))(*args), **TOL)
    assert_trees_close(out, deep_mlp(*args), **TOL)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_step_moves_them_inside_its_one_program(name):
    fn, make_args = MODELS[name]
    args = make_args()
    f = offloading(fn)
    got = jaxaot.value_and_grad(f, argnums=(0, 1))(*args)  # every input: the full mask's programs
    assert_trees_close(got, jax.value_and_grad(fn, argnums=(0, 1))(*args), **TOL)
    training = f.lookup(args, {}).programs.training()
    kept_step(f, args)  # the fused step alone, or the split pair where it timed slower
    n = sum(r.offloaded for r in training.partition.residuals)
    puts = _device_puts(fused_program(training))
    assert puts.count((jax.memory.Space.Host,)) == n and puts.count((jax.memory.Space.Device,)) == n


def _device_puts(closed):
    return [e.params["devices"] for e in closed.jaxpr.eqns if e.primitive.name == "device_put"]


def test_lower_marks_each_residual_and_compiles_the_backward_for_host_memory():
    args = deep_mlp_args()
    low = offloading(deep_mlp).lower(*args)
    rows = list(low.residuals)
    assert [r.placement for r in rows] == ["offloaded" if r.offloaded else "saved" for r in low.saved]
    assert {r.placement for r in rows} == {"saved", "offloaded"}
    assert low.residuals.offloaded_bytes == sum(r.nbytes for r in low.saved if r.offloaded) > 0
    assert low.device_saved_bytes == low.saved_bytes - low.residuals.offloaded_bytes
    text = low.details()
    assert "offloaded to host" in text and "offloaded  dot_general" in text
    hlo = low.as_text()
    assert hlo["backward"].count('mhlo.memory_kind = "pinned_host"') == sum(r.offloaded for r in low.saved)
    assert 'mhlo.memory_kind = "pinned_host"' in hlo["forward"]
    assert sum(r.offloaded for r in low.saved) == len(
        [d for d in _device_puts(low.forward) if d == (jax.memory.Space.Host,)])
    low.compile()  # the backward compiles for its host-memory residuals


@on_cpu
def test_auto_on_cpu_offloads_nothing_and_lower_says_why():
    args = deep_mlp_args()
    f = jaxaot.aot_function(deep_mlp, partition_fn=functools.partial(mincut, offload="auto"))
    low = f.lower(*args)
    assert not any(r.offloaded for r in low.saved)
    assert "nothing offloaded: the cpu backend" in str(low)  # the summary keeps the partitioner's notes
    assert low.device_saved_bytes == low.saved_bytes
    assert_trees_close(jax.grad(f)(*args), jax.grad(deep_mlp)(*args), **TOL)


def test_vmap_of_grad_through_offloaded_programs():
    args = deep_mlp_args(layers=3, width=128, batch=64)
    f = offloading(deep_mlp)
    xs = jnp.stack([args[1], -args[1]])
    got = jax.vmap(jax.grad(f), in_axes=(None, 0))(args[0], xs)
    want = jax.vmap(jax.grad(deep_mlp), in_axes=(None, 0))(args[0], xs)
    assert_trees_close(got, want, **TOL)


@pytest.mark.parametrize("policy", ["producer", "replicated"])
def test_sharded_signature_keeps_residuals_on_host_between_programs(policy):
    mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:8]), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    params, x = deep_mlp_args(layers=4, width=256, batch=512)
    params = [jax.device_put(w, NamedSharding(mesh, P())) for w in params]
    x = jax.device_put(x, NamedSharding(mesh, P("d")))
    f = offloading(deep_mlp, residual_sharding=policy)
    want = jax.grad(deep_mlp)(params, x)
    assert_trees_close(jax.grad(f)(params, x), want, **TOL)
    out, res = f.forward(params, x)
    offloaded = [a for a, r in zip(res.arrays, res.residuals) if r.offloaded]
    assert offloaded and all(a.sharding.memory_kind == "pinned_host" for a in offloaded)
    if policy == "replicated":
        assert all(a.sharding.is_fully_replicated for a in offloaded)
    assert_trees_close(f.backward(res, jnp.float32(1))[0], want, **TOL)
    assert_trees_close(jaxaot.value_and_grad(f)(params, x)[1], want, **TOL)
    assert np.isfinite(float(out))
