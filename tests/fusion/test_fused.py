"""The fused training step: one executable, gradients equal to JAX's, the plan kept inside it."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
import zoo
from jaxaot._src import compat as C
from jaxaot._src.fusion import fused_exe, fused_program
from jaxaot._src.partition.step import recomputation_inputs
from platforms import layouts_chosen
from zoo import assert_trees_close, kept_step

PARTITIONERS = {
    "default": jaxaot.partition.default_partition,
    "min_cut": jaxaot.partition.min_cut_rematerialization_partition,
    "min_cut_0": functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.0),
}
LOSSES = ["mlp_gelu", "attention", "scan", "conv", "cond", "checkpoint"]


def _key(seed):
    return jax.random.key(np.random.SeedSequence(seed).generate_state(1)[0])


def _training(f, args):
    programs = f.lookup(args, {}).programs
    return programs.training()


@pytest.mark.parametrize("partitioner", list(PARTITIONERS))
@pytest.mark.parametrize("name", LOSSES)
def test_fused_value_and_grad_equals_jax(name, partitioner):
    fn, make_args = zoo.ZOO[name]
    args = make_args(_key(hash((name, partitioner)) % 997))
    loss = lambda *a: sum(jnp.sum(y) for y in jax.tree.leaves(fn(*a)))  # noqa: E731 - a scalar loss
    f = jaxaot.aot_function(loss, partition_fn=PARTITIONERS[partitioner])
    argnums = tuple(range(len(args)))
    got = jaxaot.value_and_grad(f, argnums=argnums)(*args)
    assert_trees_close(got, jax.value_and_grad(loss, argnums=argnums)(*args), rtol=1e-4, atol=1e-5)
    kept_step(f, args)  # one correct program kept: the fused step, or the split pair where it timed slower


@pytest.mark.smoke
def test_split_mode_runs_the_two_executables_and_agrees():
    fn, make_args = zoo.ZOO["mlp_gelu"]
    args = make_args(_key(1))
    f = jaxaot.aot_function(fn, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    split = jaxaot.value_and_grad(f, fused=False)(*args)
    names = f.cache_info().entries[0].executables
    assert names and all(n.startswith(("forward", "backward")) for n in names)
    fused = jaxaot.value_and_grad(f)(*args)
    assert_trees_close(fused, split, rtol=1e-5, atol=1e-6)
    assert_trees_close(jaxaot.grad(f, fused=False)(*args), fused[1], rtol=1e-5, atol=1e-6)


def test_has_aux_and_argnums():
    def loss(w, x, scale):
        y = jnp.tanh(x @ w) * scale
        return jnp.mean(y ** 2), {"mean": jnp.mean(y)}

    ks = jax.random.split(_key(2), 2)
    w, x, scale = jax.random.normal(ks[0], (4, 3)), jax.random.normal(ks[1], (5, 4)), jnp.float32(1.5)
    f = jaxaot.aot_function(loss)
    got = jaxaot.value_and_grad(f, argnums=(0, 2), has_aux=True)(w, x, scale)
    want = jax.value_and_grad(loss, argnums=(0, 2), has_aux=True)(w, x, scale)
    assert_trees_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_backward_reads_residuals_through_a_barrier():
    fn, make_args = zoo.ZOO["mlp_gelu"]
    args = make_args(_key(3))
    f = jaxaot.aot_function(fn, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    closed = fused_program(_training(f, args))
    assert "optimization_barrier" in [e.primitive.name for e in closed.jaxpr.eqns]


def test_a_partition_that_recomputes_nothing_has_no_barrier():
    """The default partition saves what jax.vjp saves: no plan to protect, so XLA sees across."""
    fn, make_args = zoo.ZOO["mlp_gelu"]
    args = make_args(_key(4))
    tr = _training(jaxaot.aot_function(fn), args)
    assert not tr.partition.recomputed
    closed = fused_program(tr)
    assert "optimization_barrier" not in [e.primitive.name for e in closed.jaxpr.eqns]
    want = jax.value_and_grad(fn, argnums=tuple(range(len(args))))(*args)
    got = C.eval_closed(closed, *jax.tree.leaves(args))
    n_out = len(got) - len(jax.tree.leaves(want[1]))
    assert_trees_close(got[n_out:], jax.tree.leaves(want[1]), rtol=1e-4, atol=1e-6)


def test_default_partition_passes_only_what_its_recomputation_reads():
    from jaxaot._src.fusion import default_barrier

    fn, make_args = zoo.ZOO["mlp_gelu"]
    args = make_args(_key(6))
    assert default_barrier(_training(jaxaot.aot_function(fn), args)) == "recomputed"
    min_cut = jaxaot.aot_function(fn, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    assert default_barrier(_training(min_cut, args)) == "all"


@pytest.mark.parametrize("budget", [0.0, 1.0])
def test_only_residuals_the_recomputation_reads_pass_the_barrier(budget):
    """Budget 0 recomputes: its residuals feed recomputed eqns. Every residual a recomputed eqn reads is behind
    the barrier, none that only cotangent eqns read; both forms give JAX's gradients."""
    fn, make_args = zoo.ZOO["mlp_gelu"]
    args = make_args(_key(5))
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget)
    f = jaxaot.aot_function(fn, partition_fn=pf)
    tr = _training(f, args)
    n_ct = len(tr.partition.cotangent_outputs)
    backward = C.jaxpr_of(tr.partition.backward)
    residual_vars = backward.invars[n_ct:]
    read = recomputation_inputs(tr.partition.backward, n_ct)
    cotangent_free = {id(v) for v in residual_vars}
    by_recompute = set()
    for eqn in backward.eqns:  # the definition, restated: an eqn no cotangent reaches is recomputation
        ins = [v for v in eqn.invars if not C.is_literal(v)]
        if all(id(v) in cotangent_free for v in ins):
            cotangent_free.update(id(v) for v in eqn.outvars)
            by_recompute.update(i for i, r in enumerate(residual_vars) for v in ins if v is r)
    assert read == by_recompute
    if budget == 0.0:
        assert read  # something is recomputed from the residuals
    barrier = [e for e in fused_program(tr, barrier="recomputed").jaxpr.eqns
               if e.primitive.name == "optimization_barrier"]
    assert sum(len(e.invars) for e in barrier) == len(read)
    want = jax.value_and_grad(fn, argnums=tuple(range(len(args))))(*args)
    for mode in ("recomputed", "all"):
        got = C.eval_closed(fused_program(tr, barrier=mode), *jax.tree.leaves(args))
        n_out = len(got) - len(jax.tree.leaves(want[1]))
        assert_trees_close(got[n_out:], jax.tree.leaves(want[1]), rtol=1e-4, atol=1e-6)


def _deep_mlp(seed, layers=6, width=128, batch=256):
    ks = jax.random.split(_key(seed), layers + 1)
    ws = [jax.random.normal(k, (width, width)) / np.sqrt(width) for k in ks[:layers]]
    return ws, jax.random.normal(ks[-1], (batch, width))


def _loss(ws, x):
    for w in ws:
        x = jnp.tanh(jnp.sin(x @ w))
    return jnp.mean(x ** 2)


@pytest.mark.parametrize("budget", [0.0, 0.5, 1.0])
def test_fused_peak_is_no_more_than_jax_fused_step(budget):
    ws, x = _deep_mlp(4)
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget)
    f = jaxaot.aot_function(_loss, partition_fn=pf)
    assert_trees_close(jaxaot.value_and_grad(f)(ws, x), jax.value_and_grad(_loss)(ws, x), rtol=1e-4, atol=1e-6)
    mine = fused_exe(_training(f, (ws, x))).memory_analysis()
    theirs = jax.jit(jax.value_and_grad(_loss)).lower(ws, x).compile().memory_analysis()
    if mine is None or theirs is None:
        pytest.skip("this backend reports no memory analysis")
    assert mine.temp_size_in_bytes <= theirs.temp_size_in_bytes


@pytest.mark.parametrize("choice", ["auto", "pinned"])
def test_sharded_fused_step_keeps_gradient_shardings(monkeypatch, choice):
    # Both layout choices (CPU standing in for an accelerator): row-major pins sharded residuals.
    from jaxaot._src.fusion import variants

    layouts_chosen(monkeypatch)
    monkeypatch.setattr(variants, "choose_layouts", lambda auto, pinned: choice)
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    size = max(n for n in (1, 2, 4, 8) if n <= jax.device_count())  # 8 (tests/conftest.py), or the GPUs
    mesh = jax.make_mesh((size,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:size])
    ws, x = _deep_mlp(5, layers=2, width=16, batch=32)
    ws = [jax.device_put(w, NamedSharding(mesh, P(None, "data"))) for w in ws]
    x = jax.device_put(x, NamedSharding(mesh, P("data")))
    f = jaxaot.aot_function(_loss, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    (value, grads) = jaxaot.value_and_grad(f)(ws, x)
    assert_trees_close((value, grads), jax.jit(jax.value_and_grad(_loss))(ws, x), rtol=1e-4, atol=1e-6)
    for g, w in zip(grads, ws):
        assert g.sharding.is_equivalent_to(w.sharding, w.ndim)
    assert kept_step(f, (ws, x)).layouts == choice


# --------------------------------------------------------------------------- residual layouts
def test_pinned_pins_every_residual_of_two_or_more_dims():
    fn, make_args = zoo.ZOO["attention"]
    args = make_args(_key(11))
    f = jaxaot.aot_function(lambda *a: jnp.sum(fn(*a)), partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    tr = _training(f, args)
    part = tr.partition
    residuals = [tr.programs.in_avals[i] for i in part.saved_inputs] + \
        [C.jaxpr_of(part.forward).outvars[i].aval for i in part.saved_outputs]
    closed = fused_program(tr, layouts="pinned")
    pins = [e for e in closed.jaxpr.eqns if "layout" in e.primitive.name]
    assert len(pins) == sum(a.ndim >= 2 for a in residuals) > 0
    assert not [e for e in fused_program(tr).jaxpr.eqns if "layout" in e.primitive.name]
    want = jax.value_and_grad(lambda *a: jnp.sum(fn(*a)), argnums=(0, 1, 2))(*args)
    got = C.eval_closed(closed, *jax.tree.leaves(args))
    assert_trees_close(got[1:], jax.tree.leaves(want[1]), rtol=1e-4, atol=1e-6)


def _grouped_attention(q, k, v):
    s = jnp.einsum("bqhgd,bkhd->bhgqk", q, k)  # the matmul writes (b, h, q, g, k); read transposed
    p = jax.nn.softmax(s.astype(jnp.float32), axis=-1)
    return jnp.sum(jnp.einsum("bhgqk,bkhd->bqhgd", p, v) ** 2)


def test_pinned_keeps_a_transposed_residual_in_the_order_the_backward_reads_it():
    from jaxaot._src.partition.step import read_orders

    ks = jax.random.split(_key(12), 3)
    args = (jax.random.normal(ks[0], (2, 8, 2, 2, 4)), jax.random.normal(ks[1], (2, 8, 2, 4)),
            jax.random.normal(ks[2], (2, 8, 2, 4)))
    f = jaxaot.aot_function(_grouped_attention, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    tr = _training(f, args)
    part = tr.partition
    orders = read_orders(part.backward, len(part.cotangent_outputs))
    assert orders and all(o != tuple(range(len(o))) for o in orders.values())
    closed = fused_program(tr, layouts="pinned")
    pinned = [tuple(e.params["layout"].major_to_minor) for e in closed.jaxpr.eqns if "layout" in e.primitive.name]
    assert set(orders.values()) <= set(pinned)
    assert sum(o != tuple(range(len(o))) for o in pinned) == len(orders)
    want = jax.value_and_grad(_grouped_attention, argnums=(0, 1, 2))(*args)
    got = C.eval_closed(closed, *args)
    assert_trees_close(got[1:], jax.tree.leaves(want[1]), rtol=1e-4, atol=1e-6)
    got = jax.jit(lambda *a: C.eval_closed(closed, *a))(*args)  # and compiled, with its layouts
    assert_trees_close(got[1:], jax.tree.leaves(want[1]), rtol=1e-4, atol=1e-6)


def test_pinned_leaves_an_input_read_transposed_row_major():
    # The input stays alive row-major anyway: pinned in the transpose's order it would be copied.
    def loss(x, c):
        return jnp.sum(jnp.sin(x.T) * c)

    args = (jax.random.normal(_key(14), (4, 6)), jax.random.normal(_key(15), (6, 4)))
    f = jaxaot.aot_function(loss, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    tr = _training(f, args)
    from jaxaot._src.partition.step import read_orders

    assert 0 in read_orders(tr.partition.backward, len(tr.partition.cotangent_outputs))
    assert len(tr.partition.saved_inputs) > 0  # position 0 is an input
    closed = fused_program(tr, layouts="pinned")
    pinned = [tuple(e.params["layout"].major_to_minor) for e in closed.jaxpr.eqns if "layout" in e.primitive.name]
    assert pinned and all(o == tuple(range(len(o))) for o in pinned)
    got = jax.jit(lambda *a: C.eval_closed(closed, *a))(*args)
    want = jax.value_and_grad(loss, argnums=(0, 1))(*args)
    assert_trees_close(got[1:], jax.tree.leaves(want[1]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("option, value, allowed", [("layouts", "row_major", "pinned"), ("barrier", "some", "recomputed"),
                                                    ("order", "consume", "consume_first")])
def test_an_unknown_step_option_is_refused_naming_the_values_it_takes(option, value, allowed):
    fn, make_args = zoo.ZOO["mlp_gelu"]
    f = jaxaot.aot_function(fn, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    tr = _training(f, make_args(_key(13)))
    with pytest.raises(jaxaot.errors.InvalidValueError, match=f"{option} must be one of .*'{allowed}'.*{value!r}"):
        fused_program(tr, **{option: value})


def test_read_orders_leave_residuals_read_otherwise():
    from jaxaot._src.partition.step import read_orders

    def bwd(g, a, b, c, d):  # a: two transposes; b: a transpose and a sum; c: one, twice; d: also returned
        return a.T * g + jnp.transpose(a[None], (1, 0, 2))[:, 0], b.T * g + b.sum(), c.T * g + c.T, d.T * g, d

    closed = jax.make_jaxpr(bwd)(*[jnp.ones((3, 3))] * 5)
    assert read_orders(closed, 1) == {2: (1, 0)}


@pytest.mark.parametrize("choice", ["pinned", "auto", "measured"])
@pytest.mark.parametrize("name", ["attention", "conv", "scan"])
def test_layout_choice_on_an_accelerator_keeps_one_correct_executable(monkeypatch, name, choice):
    # CPU stands in for an accelerator: both programs compile, one is kept under the fused name.
    from jaxaot._src.fusion import variants

    layouts_chosen(monkeypatch)
    if choice != "measured":
        monkeypatch.setattr(variants, "choose_layouts", lambda auto, pinned: choice)
    fn, make_args = zoo.ZOO[name]
    args = make_args(_key(hash((name, choice)) % 991))
    loss = lambda *a: sum(jnp.sum(jnp.tanh(y)) for y in jax.tree.leaves(fn(*a)))  # noqa: E731
    f = jaxaot.aot_function(loss, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    argnums = tuple(range(len(args)))
    got = jaxaot.value_and_grad(f, argnums=argnums)(*args)
    assert_trees_close(got, jax.value_and_grad(loss, argnums=argnums)(*args), rtol=1e-4, atol=1e-5)
    only = kept_step(f, args)  # the pinned candidate is not kept aside
    assert only.layouts in (("pinned", "auto") if choice == "measured" else (choice,))


def test_layout_choice_rule():
    from jaxaot._src.fusion.variants import LAYOUT_PEAK_SLACK, choose_layouts

    assert choose_layouts(10_000, 10_000) == "pinned"
    assert choose_layouts(10_000, int(10_000 * (1 + LAYOUT_PEAK_SLACK))) == "pinned"
    assert choose_layouts(10_000, int(10_000 * (1 + 2 * LAYOUT_PEAK_SLACK))) == "auto"
    assert choose_layouts(None, 5) == choose_layouts(5, None) == "auto"


def test_a_refused_layout_keeps_xla_s_choice(monkeypatch):
    from jaxaot._src.fusion import variants

    layouts_chosen(monkeypatch)
    real = variants.fused_program

    def refusing(training, value_leaf=0, barrier="all", layouts="auto", order="xla", **options):
        if layouts == "pinned":
            raise NotImplementedError("no layouts here")
        return real(training, value_leaf, barrier, layouts, order, **options)

    monkeypatch.setattr(variants, "fused_program", refusing)
    fn, make_args = zoo.ZOO["mlp_gelu"]
    args = make_args(_key(5))
    f = jaxaot.aot_function(fn, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    got = jaxaot.value_and_grad(f, argnums=(0, 1))(*args)
    assert_trees_close(got, jax.value_and_grad(fn, argnums=(0, 1))(*args), rtol=1e-4, atol=1e-5)
    assert kept_step(f, args).layouts == "auto"


# --------------------------------------------------------------------------- backward order
def test_order_choice_rule():
    from jaxaot._src.fusion.variants import ORDER_PEAK_GAIN, choose_order

    assert choose_order(10_000, 10_000) == "xla"
    assert choose_order(10_000, int(10_000 * (1 - ORDER_PEAK_GAIN / 2))) == "xla"
    assert choose_order(10_000, int(10_000 * (1 - 2 * ORDER_PEAK_GAIN))) == "consume_first"
    assert choose_order(None, 5) == choose_order(5, None) == "xla"


@pytest.mark.parametrize("choice", ["xla", "consume_first", "measured"])
@pytest.mark.parametrize("name", ["attention", "mlp_gelu"])
def test_order_choice_on_an_accelerator_keeps_one_correct_executable(monkeypatch, name, choice):
    # CPU stands in for an accelerator: the consume-first candidate compiles, one executable is kept.
    from jaxaot._src.fusion import variants

    layouts_chosen(monkeypatch)
    monkeypatch.setattr(variants, "choose_barrier", lambda barrier, kept, free: barrier)  # the order is under test
    if choice != "measured":
        monkeypatch.setattr(variants, "choose_order", lambda xla, ordered: choice)
    fn, make_args = zoo.ZOO[name]
    args = make_args(_key(hash((name, choice, 3)) % 991))
    loss = lambda *a: sum(jnp.sum(jnp.tanh(y)) for y in jax.tree.leaves(fn(*a)))  # noqa: E731
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.5)
    f = jaxaot.aot_function(loss, partition_fn=pf)
    argnums = tuple(range(len(args)))
    got = jaxaot.value_and_grad(f, argnums=argnums)(*args)
    assert_trees_close(got, jax.value_and_grad(loss, argnums=argnums)(*args), rtol=1e-4, atol=1e-5)
    only = kept_step(f, args)
    assert only.order in (("xla", "consume_first") if choice == "measured" else (choice,))


def test_row_major_leaves_convolution_operands_to_the_backend():
    from jaxaot._src.partition.step import library_kernel_residuals

    fn, make_args = zoo.ZOO["conv"]
    args = make_args(_key(13))
    loss = lambda *a: jnp.sum(jnp.tanh(fn(*a)))  # noqa: E731
    f = jaxaot.aot_function(loss, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    tr = _training(f, args)
    part = tr.partition
    fwd = C.jaxpr_of(part.forward)
    residuals = [fwd.invars[i] for i in part.saved_inputs] + [fwd.outvars[i] for i in part.saved_outputs]
    convs = [e for e in fwd.eqns if e.primitive.name == "conv_general_dilated"]
    conv_vars = {id(v) for e in convs for v in (*e.invars, *e.outvars)}
    library = library_kernel_residuals(part, 1)
    assert library == {i for i, v in enumerate(residuals) if id(v) in conv_vars} and library
    closed = fused_program(tr, layouts="pinned")
    pinned = sum("layout" in e.primitive.name for e in closed.jaxpr.eqns)
    assert pinned == sum(v.aval.ndim >= 2 for i, v in enumerate(residuals) if i not in library)
    got = C.eval_closed(closed, *jax.tree.leaves(args))
    want = jax.value_and_grad(loss, argnums=(0, 1))(*args)
    assert_trees_close(got[1:], jax.tree.leaves(want[1]), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- the barrier
def test_barrier_choice_rule():
    from jaxaot._src.fusion import choose_barrier

    assert choose_barrier("all", 10_000, 10_000) == "none"
    assert choose_barrier("all", 10_000, 9_000) == "none"
    assert choose_barrier("recomputed", 10_000, 10_001) == "recomputed"
    assert choose_barrier("all", None, 5) == choose_barrier("all", 5, None) == "all"


@pytest.mark.parametrize("choice", ["kept", "none", "measured"])
@pytest.mark.parametrize("name", ["attention", "conv", "scan"])
def test_barrier_choice_on_an_accelerator_keeps_one_correct_executable(monkeypatch, name, choice):
    # CPU stands in for an accelerator: the step without the barrier compiles too, one executable is kept.
    from jaxaot._src.fusion import variants

    layouts_chosen(monkeypatch)
    seen, real = [], variants.choose_barrier

    def rule(barrier, kept, free):
        seen.append((kept, free))
        return {"kept": barrier, "none": "none", "measured": real(barrier, kept, free)}[choice]

    monkeypatch.setattr(variants, "choose_barrier", rule)
    fn, make_args = zoo.ZOO[name]
    args = make_args(_key(hash((name, choice, 7)) % 991))
    loss = lambda *a: sum(jnp.sum(jnp.tanh(y)) for y in jax.tree.leaves(fn(*a)))  # noqa: E731
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.0)
    f = jaxaot.aot_function(loss, partition_fn=pf)
    argnums = tuple(range(len(args)))
    got = jaxaot.value_and_grad(f, argnums=argnums)(*args)
    assert_trees_close(got, jax.value_and_grad(loss, argnums=argnums)(*args), rtol=1e-4, atol=1e-5)
    only = kept_step(f, args)
    assert len(seen) == 1  # budget 0 recomputes, so the free step was compiled and weighed once
    kept, free = seen[0]
    want = {"kept": "all", "none": "none", "measured": "none" if free <= kept else "all"}[choice]
    assert only.barrier == want
    if want == "none":
        assert only.order == "xla"
    (choice_info,) = f.cache_info().entries[0].fused  # the same, through the public report
    assert (choice_info.layouts, choice_info.order, choice_info.barrier) == (only.layouts, only.order, want)


@pytest.mark.parametrize("name", ["attention", "mlp_gelu"])
def test_under_a_byte_budget_the_chain_weighs_only_the_variants_that_may_speed_the_step(monkeypatch, name):
    # CPU stands in for an accelerator. At fraction 0 the chain weighs the consume-first order too; under a byte
    # budget the step fits already, so only pinned layouts and no barrier are compiled, and none is kept over it.
    from jaxaot._src.fusion import variants
    from jaxaot._src.partition import compiled_peak, measure_step_peak

    layouts_chosen(monkeypatch)
    compiled, real = [], variants._compile_variant

    def spy(training, name_, value_leaf, v, returned, **kw):
        compiled.append((v.layouts, v.order, v.barrier, len(v.rederived)))
        return real(training, name_, value_leaf, v, returned, **kw)

    monkeypatch.setattr(variants, "_compile_variant", spy)
    fn, make_args = zoo.ZOO[name]
    args = make_args(_key(hash((name, 23)) % 997))
    loss = lambda *a: sum(jnp.sum(jnp.tanh(y)) for y in jax.tree.leaves(fn(*a)))  # noqa: E731
    argnums = tuple(range(len(args)))
    want = jax.value_and_grad(loss, argnums=argnums)(*args)
    mincut = jaxaot.partition.min_cut_rematerialization_partition
    joint = jaxaot.partition.trace_joint(loss, *args)
    budget = measure_step_peak(mincut(joint, memory_budget=0.0), joint, split=False).fused
    weighed = {}
    for b in (0.0, budget):
        compiled.clear()
        f = jaxaot.aot_function(loss, partition_fn=functools.partial(mincut, memory_budget=b))
        assert_trees_close(jaxaot.value_and_grad(f, argnums=argnums)(*args), want, rtol=1e-4, atol=1e-5)
        zoo.finish_tuning(f, args)
        weighed[b] = list(compiled)
        if b == budget:
            choice = kept_step(f, args)
            assert compiled_peak(f.lookup(args, {}).programs.executables[choice.executable]) <= budget
    assert any(order == "consume_first" for _, order, _, _ in weighed[0.0])
    assert weighed[budget] and all(order == "xla" and not k for _, order, _, k in weighed[budget])
    assert {layouts for layouts, *_ in weighed[budget]} == {"pinned"}


def test_a_step_that_recomputes_nothing_has_no_barrier_to_weigh(monkeypatch):
    from jaxaot._src.fusion import variants

    layouts_chosen(monkeypatch)
    monkeypatch.setattr(variants, "choose_barrier", lambda *a: pytest.fail("no barrier to weigh"))
    fn, make_args = zoo.ZOO["mlp_gelu"]
    args = make_args(_key(17))
    f = jaxaot.aot_function(fn)  # the default partition recomputes no residual's producer
    got = jaxaot.value_and_grad(f, argnums=(0, 1))(*args)
    assert_trees_close(got, jax.value_and_grad(fn, argnums=(0, 1))(*args), rtol=1e-4, atol=1e-5)
    assert kept_step(f, args).barrier in ("recomputed", "none")


def test_cache_info_reports_each_fused_step_s_variant():
    fn, make_args = zoo.ZOO["mlp_gelu"]
    args = make_args(_key(23))
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.0)
    f = jaxaot.aot_function(fn, partition_fn=pf)
    jaxaot.value_and_grad(f, argnums=(0, 1))(*args)
    choice = kept_step(f, args)  # the fused step or, where timing chose it (accelerators), the split pair
    (entry,) = f.cache_info().entries
    assert entry.fused == (choice,) and choice.executable.startswith("fused")
    on_cpu = jax.default_backend() == "cpu"  # CPU compiles one variant: XLA's layouts and order, every residual barred
    assert (choice.layouts, choice.order, choice.barrier) == ("auto", "xla", "all") or not on_cpu
    split = jaxaot.aot_function(fn, partition_fn=pf)
    jaxaot.value_and_grad(split, argnums=(0, 1), fused=False)(*args)
    assert split.cache_info().entries[0].fused == ()  # the split executables are not fused steps
