"""Every option of every public constructor is checked when it is given, with a typed error naming it.

One table: constructor, option, a bad value, the error ``docs/errors.md`` gives
for it (``InvalidInputError`` for the wrong kind, ``InvalidValueError`` for a
value of the right kind jaxaot does not take, the loop and partitioner errors
for their options). Each row checks that building fails at once (not at the
first gradient), with that error, naming the option, and that a good one built
after it works: nothing was left half-built.

Rows marked ``xfail(strict=True)`` are options whose module another part of the
code base owns and which are not checked yet; each says what happens instead.
When one is fixed the row passes, and strict xfail fails it until its mark goes.
"""

from __future__ import annotations

import functools
import math
import re
import tempfile

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot.errors import (
    InvalidInputError, InvalidLoopOptionError, InvalidValueError, LoopFunctionError, PartitionError,
)

X = jnp.ones((4, 3))


def _loss(x):
    return jnp.sum(jnp.sin(x) ** 2)


def _layer(w, x):
    return jnp.tanh(x @ w)


def _mse(y, t):
    return jnp.mean((y - t) ** 2)


@functools.cache
def _artifact() -> str:
    return jaxaot.export.export(_loss, X).save(tempfile.mkdtemp() + "/artifact")


def _nnx_linear():
    from flax import nnx

    return nnx.Linear(3, 2, rngs=nnx.Rngs(0))


def _bounded(kw: dict) -> dict:
    """A reverse-differentiated loop needs a bound: ``max_steps`` unless the row gives ``checkpoints``."""
    return kw if "checkpoints" in kw else {"max_steps": 8, **kw}


def _loop(**kw):
    kw = _bounded(kw)
    cond, body = kw.pop("cond_fun", lambda c: c[0] < 3), kw.pop("body_fun", lambda c: (c[0] + 1, jnp.sin(c[1])))
    return jax.grad(lambda x: jnp.sum(jaxaot.loops.while_loop(cond, body, (0, x), **kw)[1]))(X)


def _under_patch(patch):
    with patch:
        return jax.grad(lambda x: jnp.sum(jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.sin(c[1])),
                                                             (0, x))[1]))(X)


def _pipeline_options(kw: dict) -> dict:
    """A two-stage GPipe step: the Python executor on one device given twice, unless the row gives the
    compiled executor's options (a mesh, its axes), which then runs on the first two devices."""
    compiled = kw.keys() & {"mesh", "stage_axis", "data_axes"} or kw.get("executor", "python") != "python"
    where = {} if compiled else {"executor": "python", "devices": [jax.devices()[0]] * 2}
    return {"stages": [_layer, _layer], "loss_fn": _mse, "schedule": "gpipe", "num_microbatches": 2, **where, **kw}


#: constructor -> (build(**options), use(the built object)): ``use`` runs a good one.
BUILD = {
    "aot_function": (lambda **kw: jaxaot.aot_function(kw.pop("fn", _loss), **kw), lambda f: jax.grad(f)(X)),
    "aot_module": (lambda **kw: jaxaot.nn.aot_module(kw.pop("module", None) or _nnx_linear(), **kw), lambda m: m(X)),
    "value_and_grad": (lambda **kw: jaxaot.value_and_grad(kw.pop("fun", jaxaot.aot_function(_loss)), **kw),
                       lambda vg: vg(X)),
    "grad": (lambda **kw: jaxaot.grad(kw.pop("fun", jaxaot.aot_function(_loss)), **kw), lambda g: g(X)),
    "compiled_grad": (lambda **kw: jaxaot.compiled_grad(kw.pop("fun", _loss), **kw), lambda g: g(X)),
    "compiled_value_and_grad": (lambda **kw: jaxaot.compiled_value_and_grad(kw.pop("fun", _loss), **kw),
                                lambda vg: vg(X)),
    "pipeline": (lambda **kw: jaxaot.parallel.pipeline(**_pipeline_options(kw)),
                 lambda step: step([jnp.eye(3), jnp.eye(3)], X, jnp.zeros((4, 3)))),
    "make_schedule": (lambda **kw: jaxaot.parallel.make_schedule(**{"schedule": "1f1b", "num_stages": 2,
                                                           "num_microbatches": 4, **kw}), lambda s: s.validate()),
    "export": (lambda **kw: jaxaot.export.export(kw.pop("fn", _loss), X, **kw), lambda e: jaxaot.export.load(e)(X)),
    "load": (lambda **kw: jaxaot.export.load(kw.pop("path", None) or _artifact(), **kw), lambda f: f(X)),
    "remat_policy": (lambda **kw: jaxaot.partition.remat_policy(kw.pop("fn", _loss), X, **kw),
                     lambda p: jax.grad(jax.checkpoint(_loss, policy=p))(X)),
    "min_cut_rematerialization_partition": (
        lambda **kw: jaxaot.partition.min_cut_rematerialization_partition(**kw),
        lambda p: jax.grad(jaxaot.aot_function(_loss, partition_fn=p))(X)),
    "DeviceModel": (lambda **kw: jaxaot.partition.DeviceModel(**{"host_bandwidth": 1e10, "device_flops": 1e12, **kw}),
                    lambda d: jaxaot.partition.min_cut_rematerialization_partition(device_model=d)),
    "while_loop": (lambda **kw: _loop(**kw), lambda grads: grads),
    "patch_while_loop": (lambda **kw: jaxaot.loops.patch_while_loop(**_bounded(kw)), _under_patch),
}


def _owned_elsewhere(reason: str):
    return pytest.mark.xfail(strict=True, reason=reason)


def _row(ctor, option, bad, error, mark=None):
    return pytest.param(ctor, option, bad, error, marks=() if mark is None else mark,
                        id=f"{ctor}-{option}={_stable_repr(bad)}"[:80])


def _stable_repr(value) -> str:
    """``repr`` without memory addresses: test ids must be equal in every xdist worker."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


NOT_A_FUNCTION = "not a function"
ROWS = [
    # the runtime
    _row("aot_function", "fn", 3, InvalidInputError),
    _row("aot_function", "fn", NOT_A_FUNCTION, InvalidInputError),
    _row("aot_function", "fw_compiler", "xla", InvalidInputError),
    _row("aot_function", "bw_compiler", 3, InvalidInputError),
    _row("aot_function", "inference_compiler", 3, InvalidInputError),
    _row("aot_function", "partition_fn", "min_cut", InvalidInputError),
    _row("aot_function", "partition_fn", 0.5, InvalidInputError),
    _row("aot_function", "decompositions", [1], InvalidInputError),
    _row("aot_function", "decompositions", {"sin": jnp.cos}, InvalidInputError),
    _row("aot_function", "decompositions", {jax.lax.sin_p: 3}, InvalidInputError),
    _row("aot_function", "static_argnums", 1.5, InvalidInputError),
    _row("aot_function", "static_argnums", True, InvalidInputError),
    _row("aot_function", "static_argnums", -1, InvalidInputError),
    _row("aot_function", "static_argnums", [0, "1"], InvalidInputError),
    _row("aot_function", "donate_argnums", "a", InvalidInputError),
    _row("aot_function", "donate_argnums", -2, InvalidInputError),
    _row("aot_function", "out_shardings", 3, InvalidInputError),
    _row("aot_function", "out_shardings", {"y": "replicated"}, InvalidInputError),
    _row("aot_function", "residual_sharding", "everywhere", InvalidValueError),
    _row("aot_function", "residual_sharding", None, InvalidInputError),
    _row("aot_function", "residual_sharding", 3, InvalidInputError),
    # eager gradients
    _row("value_and_grad", "fun", 3, InvalidInputError),
    _row("value_and_grad", "argnums", "a", InvalidInputError),
    _row("value_and_grad", "argnums", 1.5, InvalidInputError),
    _row("value_and_grad", "argnums", (), InvalidInputError),
    _row("value_and_grad", "argnums", True, InvalidInputError),
    _row("value_and_grad", "has_aux", "yes", InvalidInputError),
    _row("value_and_grad", "has_aux", None, InvalidInputError),
    _row("value_and_grad", "fused", "yes", InvalidInputError),
    _row("value_and_grad", "fused", None, InvalidInputError),
    _row("value_and_grad", "holomorphic", "yes", InvalidInputError),
    _row("value_and_grad", "allow_int", 1, InvalidInputError),
    _row("grad", "fun", None, InvalidInputError),
    _row("grad", "argnums", [0, None], InvalidInputError),
    _row("grad", "has_aux", 1, InvalidInputError),
    _row("grad", "fused", 0, InvalidInputError),
    _row("grad", "holomorphic", None, InvalidInputError),
    _row("grad", "allow_int", "no", InvalidInputError),
    _row("compiled_grad", "fun", 3, InvalidInputError),
    _row("compiled_grad", "argnums", "a", InvalidInputError),
    _row("compiled_grad", "argnums", (), InvalidInputError),
    _row("compiled_grad", "has_aux", "x", InvalidInputError),
    _row("compiled_grad", "param_hooks", 3, InvalidInputError),
    _row("compiled_grad", "param_hooks", {1: jnp.sin}, InvalidInputError),
    _row("compiled_grad", "param_hooks", {"w": 3}, InvalidInputError),
    _row("compiled_value_and_grad", "fun", "loss", InvalidInputError),
    _row("compiled_value_and_grad", "argnums", 1.5, InvalidInputError),
    _row("compiled_value_and_grad", "param_hooks", ["w"], InvalidInputError),
    _row("compiled_value_and_grad", "has_aux", None, InvalidInputError),
    _row("compiled_value_and_grad", "replay", "yes", InvalidInputError),
    _row("compiled_value_and_grad", "holomorphic", "yes", InvalidInputError),
    _row("compiled_value_and_grad", "allow_int", 1, InvalidInputError),
    _row("compiled_grad", "replay", 1, InvalidInputError),
    _row("compiled_grad", "holomorphic", None, InvalidInputError),
    _row("compiled_grad", "allow_int", "no", InvalidInputError),
    # reduce_axes: empty only, as jax.grad takes it (its own NotImplementedError otherwise)
    _row("value_and_grad", "reduce_axes", ("batch",), NotImplementedError),
    _row("grad", "reduce_axes", ("batch",), NotImplementedError),
    _row("compiled_value_and_grad", "reduce_axes", ("batch",), NotImplementedError),
    _row("compiled_grad", "reduce_axes", ("batch",), NotImplementedError),
    # pipelines
    _row("pipeline", "stages", [], InvalidInputError),
    _row("pipeline", "stages", [_layer, 3], InvalidInputError),
    _row("pipeline", "loss_fn", 3, InvalidInputError),
    _row("pipeline", "schedule", "fastest", InvalidValueError),
    _row("pipeline", "schedule", 3, InvalidInputError),
    _row("pipeline", "num_microbatches", 0, InvalidValueError),
    _row("pipeline", "num_microbatches", 1.5, InvalidInputError),
    _row("pipeline", "num_microbatches", True, InvalidInputError),
    _row("pipeline", "devices", 3, InvalidInputError),
    _row("pipeline", "devices", ["gpu0"], InvalidInputError),
    _row("pipeline", "devices", [], InvalidInputError),
    _row("pipeline", "partition_fn", 3, InvalidInputError),
    _row("pipeline", "executor", 3, InvalidInputError),
    _row("pipeline", "executor", "fastest", InvalidValueError),
    _row("pipeline", "mesh", 3, InvalidInputError),
    _row("pipeline", "stage_axis", 3, InvalidInputError),
    _row("pipeline", "data_axes", 3, InvalidInputError),
    _row("pipeline", "data_axes", [0], InvalidInputError),
    _row("pipeline", "param_specs", 3, InvalidInputError),
    _row("pipeline", "param_specs", [None] * 5, InvalidInputError),
    _row("make_schedule", "schedule", "fastest", InvalidValueError),
    _row("make_schedule", "num_stages", 0, InvalidValueError),
    _row("make_schedule", "num_microbatches", -1, InvalidValueError),
    _row("make_schedule", "num_devices", 0, InvalidValueError),
    _row("make_schedule", "schedule", None, InvalidInputError),
    # Flax modules (jaxaot._src.nn)
    _row("aot_module", "module", 3, InvalidInputError),
    _row("aot_module", "method", 3, InvalidInputError),
    _row("aot_module", "method", "no_such_method", InvalidInputError),
    _row("aot_module", "fw_compiler", 3, InvalidInputError),
    _row("aot_module", "partition_fn", "min_cut", InvalidInputError),
    _row("aot_module", "decompositions", [1], InvalidInputError),
    _row("aot_module", "static_argnums", -1, InvalidInputError),
    _row("aot_module", "static_argnums", 1.5, InvalidInputError),
    _row("aot_module", "static_argnums", True, InvalidInputError),
    _row("aot_module", "static_argnums", [0, "1"], InvalidInputError),
    _row("aot_module", "static_argnames", 3, InvalidInputError),
    _row("aot_module", "static_argnames", [1], InvalidInputError),
    # export and load (jaxaot._src.artifacts)
    _row("export", "partition_fn", 3, InvalidInputError),
    _row("export", "dynamic_shapes", 3, InvalidInputError),
    _row("export", "platforms", 3, InvalidInputError),
    _row("load", "path", 3, InvalidInputError),
    _row("load", "check_versions", "yes", InvalidInputError),
    _row("load", "allow_callbacks", "no", InvalidInputError),
    _row("load", "max_bytes", -1, InvalidValueError),
    _row("load", "max_bytes", "1GB", InvalidInputError),
    _row("load", "allow_custom_calls", "tpu_custom_call", InvalidInputError),
    _row("load", "allow_custom_calls", [7], InvalidInputError),
    _row("load", "key", "a password", InvalidInputError),
    _row("load", "key", b"short", InvalidValueError),
    # partitioners (jaxaot._src.partition)
    _row("min_cut_rematerialization_partition", "memory_budget", "1.5", InvalidValueError),
    _row("min_cut_rematerialization_partition", "memory_budget", None, InvalidInputError),
    _row("min_cut_rematerialization_partition", "memory_budget", -1, InvalidValueError),
    _row("min_cut_rematerialization_partition", "memory_budget", math.nan, InvalidValueError),
    _row("min_cut_rematerialization_partition", "offload", "sometimes", PartitionError),
    _row("min_cut_rematerialization_partition", "offload", None, PartitionError),
    _row("min_cut_rematerialization_partition", "device_model", 3, PartitionError),
    _row("min_cut_rematerialization_partition", "op_costs", "guess", PartitionError),
    _row("min_cut_rematerialization_partition", "rematerialize_scans", "yes", InvalidInputError),
    _row("min_cut_rematerialization_partition", "rematerialize_scans", None, InvalidInputError),
    _row("remat_policy", "fn", 3, InvalidInputError),
    _row("remat_policy", "fn", "loss", InvalidInputError),
    _row("remat_policy", "memory_budget", "half", InvalidValueError),
    _row("remat_policy", "partition_fn", 3, InvalidInputError),
    _row("remat_policy", "offload", "sometimes", PartitionError),
    _row("remat_policy", "offload", None, PartitionError),
    _row("remat_policy", "device_model", 3, PartitionError),
    _row("DeviceModel", "headroom", 0, InvalidValueError),
    _row("DeviceModel", "host_bandwidth", -1.0, InvalidValueError),
    _row("DeviceModel", "host_bandwidth", "fast", InvalidInputError),
    _row("DeviceModel", "device_flops", 0.0, InvalidValueError),
    _row("DeviceModel", "overlap", 2.0, InvalidValueError),
    _row("DeviceModel", "copy_slots", 0, InvalidValueError),
    _row("DeviceModel", "copy_slots", 1.5, InvalidInputError),
    _row("DeviceModel", "device_flops", math.inf, InvalidValueError),
    _row("DeviceModel", "device_bandwidth", 0, InvalidValueError),
    _row("DeviceModel", "transfer_latency", "1us", InvalidInputError),
    _row("DeviceModel", "transfer_latency", -1e-6, InvalidValueError),
    _row("DeviceModel", "scan_overlap", math.nan, InvalidValueError),
    _row("DeviceModel", "has_host_memory", "yes", InvalidInputError),
    _row("DeviceModel", "note", 3, InvalidInputError),
    # while loops (jaxaot._src.loops)
    _row("while_loop", "cond_fun", 3, LoopFunctionError),
    _row("while_loop", "body_fun", None, LoopFunctionError),
    _row("while_loop", "max_steps", 0, InvalidLoopOptionError),
    _row("while_loop", "max_steps", 1.5, InvalidLoopOptionError),
    _row("while_loop", "max_steps", True, InvalidLoopOptionError),
    _row("while_loop", "checkpoints", 0, InvalidLoopOptionError),
    _row("while_loop", "checkpoints", "two", InvalidLoopOptionError),
    _row("while_loop", "checkpoint_memory", "disk", InvalidLoopOptionError),
    _row("patch_while_loop", "max_steps", -1, InvalidLoopOptionError),
    _row("patch_while_loop", "checkpoints", 2.5, InvalidLoopOptionError),
    _row("patch_while_loop", "checkpoint_memory", 3, InvalidLoopOptionError),
]


@pytest.mark.parametrize("ctor, option, bad, error", ROWS)
def test_a_bad_option_fails_at_construction_naming_it(ctor, option, bad, error):
    build, use = BUILD[ctor]
    with pytest.raises(error) as raised:
        build(**{option: bad})
    assert option in str(raised.value), str(raised.value)
    use(build())  # nothing half-built: a good one works after


def test_the_table_covers_every_option_of_every_constructor():
    """A new option (or constructor) gets a row: the table is checked against the signatures."""
    import inspect

    skip = {"args", "example_args", "example_kwargs"}  # the call's own arguments, not options
    covered = {(c, o) for c, o, *_ in (p.values for p in ROWS)}
    missing = []
    faces = [getattr(jaxaot, f) for f in ("partition", "loops", "nn", "parallel", "export")] + [jaxaot]
    for ctor in BUILD:
        fn = next(getattr(face, ctor) for face in faces if ctor in face.__all__)
        params = inspect.signature(fn).parameters
        missing += [(ctor, name) for name in params if name not in skip and (ctor, name) not in covered]
    allowed = {("aot_module", "bw_compiler"), ("aot_module", "inference_compiler"),  # as aot_function's
               ("aot_function", "donate_argnums"), ("export", "fn_or_aot_function"),
               ("remat_policy", "op_costs"), ("while_loop", "init_val"), ("make_schedule", "op_times"),
               ("min_cut_rematerialization_partition", "joint")}
    assert set(missing) <= allowed, sorted(set(missing) - allowed)


def test_a_partitioner_that_returns_no_partition_is_named():
    f = jaxaot.aot_function(_loss, partition_fn=lambda joint: "a plan")
    with pytest.raises(PartitionError, match="partition_fn .*<lambda> returned a str, not a jaxaot.partition.Partition"):
        jax.grad(f)(X)


def test_a_configured_min_cut_is_checked_when_aot_function_is_built():
    bad = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget="half")
    with pytest.raises(InvalidValueError, match="memory_budget 'half'"):
        jaxaot.aot_function(_loss, partition_fn=bad)
    good = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.5)
    f = jaxaot.aot_function(_loss, partition_fn=good)
    assert jnp.allclose(jax.grad(f)(X), jax.grad(_loss)(X), rtol=1e-5)
