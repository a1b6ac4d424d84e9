"""Random JAX programs for the differential fuzzer, and the check that jaxaot agrees with JAX on them.

A :class:`Program` is data (a dtype, side-input flags and a list of op specs),
so hypothesis can draw, shrink and print it, and a failing one pastes into a
named regression test. :meth:`Program.fn` interprets it as an ordinary JAX
function ``f(x, w, b, n, mask, key) -> scalar loss``: ``x`` (3,4), ``w``
(4,4) and ``b`` (4,) are differentiated; ``n`` (int32), ``mask`` (bool) and
``key`` (typed or raw PRNG key) are side inputs.

:func:`check_program` runs it through every partitioner and every path and
compares values and gradients with ``jax.value_and_grad`` on the same inputs.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax

import jaxaot

DTYPES = ("float32", "bfloat16", "float16")
LOOP_MODES = ("max_steps", "checkpoints", "unbounded")
UNARY = ("sin", "cos", "tanh", "sigmoid", "square", "relu", "abs", "gelu", "log1p_abs", "softplus")
BINARY = ("add", "sub", "mul", "maximum", "safe_div")
#: op name -> number of pool operands
OPS = {
    "unary": 1, "binary": 2, "bias": 1, "dot": 1, "einsum": 3, "reshape_t": 1, "reduce": 1, "softmax": 1,
    "where": 2, "where_mask": 2, "cond": 2, "scan": 1, "while": 2, "checkpoint": 2, "custom_jvp": 1,
    "custom_vjp": 2, "dropout": 1, "noise": 1, "int_scale": 1,
}
PARTITIONERS = {
    "default": jaxaot.partition.default_partition,
    "min_cut_1": functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=1.0),
    "min_cut_0.5": functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.5),
    "min_cut_0": functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.0),
}
PATHS = ("eager_value_and_grad", "jax_grad", "jit", "vmap", "forward_backward", "export_load",
         "compiled_autograd")
#: max |got - want| <= TOL * (1 + max |want|), per dtype (one rounding of a short program, not bit equality)
TOL = {"float32": 2e-4, "bfloat16": 6e-2, "float16": 1e-2}


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    args: tuple[int, ...]  # pool indices, taken modulo the pool's size
    param: Any = None


@dataclasses.dataclass(frozen=True)
class Program:
    dtype: str
    ops: tuple[Op, ...]
    key: str | None = None  # None, "typed" or "raw"
    loop_mode: str = "max_steps"
    n: int = 2  # the int side input's value (a while loop's trip count)
    seed: int = 0  # the inputs' values

    @property
    def unbounded(self) -> bool:
        return self.loop_mode == "unbounded" and any(op.name == "while" for op in self.ops)

    def inputs(self, batch: int | None = None) -> tuple:
        rng = np.random.default_rng(self.seed)
        lead = () if batch is None else (batch,)
        dt = jnp.dtype(self.dtype)
        x = jnp.asarray(rng.standard_normal(lead + (3, 4)) * 0.8, dt)
        w = jnp.asarray(rng.standard_normal((4, 4)) * 0.5, dt)
        b = jnp.asarray(rng.standard_normal(4) * 0.5, dt)
        n = jnp.int32(self.n)
        mask = jnp.asarray(rng.random((3, 4)) < 0.5)
        if self.key == "typed":
            key = jax.random.key(int(rng.integers(2**31)))
        elif self.key == "raw":
            key = jax.random.PRNGKey(int(rng.integers(2**31)))
        else:
            key = jnp.zeros((), jnp.int32)  # unused
        return x, w, b, n, mask, key

    def fn(self) -> Callable:
        return functools.partial(_interpret, self)


def _unary(name: str, a):
    return {
        "sin": jnp.sin, "cos": jnp.cos, "tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid, "square": jnp.square,
        "relu": jax.nn.relu, "abs": jnp.abs, "gelu": jax.nn.gelu, "log1p_abs": lambda v: jnp.log1p(jnp.abs(v)),
        "softplus": jax.nn.softplus,
    }[name](a)


def _binary(name: str, a, c):
    if name == "safe_div":
        return a / (1 + c * c)
    return {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "maximum": jnp.maximum}[name](a, c)


@jax.custom_jvp
def _swish(x):
    return x * jax.nn.sigmoid(x)


@_swish.defjvp
def _swish_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    s = jax.nn.sigmoid(x)
    return x * s, t * (s + x * s * (1 - s))


@jax.custom_vjp
def _sin_mul(a, c):
    return jnp.sin(a) * c


def _sin_mul_fwd(a, c):
    return jnp.sin(a) * c, (a, c)


def _sin_mul_bwd(res, g):
    a, c = res
    return g * jnp.cos(a) * c, g * jnp.sin(a)


_sin_mul.defvjp(_sin_mul_fwd, _sin_mul_bwd)


def _op_key(prog: Program, key, i: int):
    return jax.random.fold_in(key, i)  # typed keys and raw uint32[2] keys alike


def _apply(prog: Program, op: Op, i: int, pool: list, x, w, b, n, mask, key):
    dt = jnp.dtype(prog.dtype)
    a, *rest = [pool[j % len(pool)] for j in op.args]
    c = rest[0] if rest else None
    if op.name == "unary":
        return _unary(op.param, a)
    if op.name == "binary":
        return _binary(op.param, a, c)
    if op.name == "bias":
        return a + b[None, :]
    if op.name == "dot":
        return (a @ w) * jnp.asarray(0.5, dt)
    if op.name == "einsum":
        s = lax.dot_general(a, c, (((1,), (1,)), ((), ())))  # (3,3)
        return jnp.einsum("ij,jk->ik", s, rest[1]) * jnp.asarray(0.25, dt)
    if op.name == "reshape_t":
        return a.reshape(4, 3).T
    if op.name == "reduce":
        kind, axis = op.param
        red = {"sum": jnp.sum, "max": jnp.max, "mean": jnp.mean, "logsumexp": jax.nn.logsumexp}[kind]
        return a - red(a, axis=axis, keepdims=True).astype(dt) * jnp.asarray(0.5, dt)
    if op.name == "softmax":
        return jax.nn.softmax(a, axis=op.param)
    if op.name == "where":
        return jnp.where(a > c, a, c * jnp.asarray(2, dt))
    if op.name == "where_mask":
        return jnp.where(mask, a, jnp.tanh(c))
    if op.name == "cond":
        pred = (n % 2 == 0) if op.param == "int" else (jnp.sum(a.astype(jnp.float32)) > 0)
        return lax.cond(pred, lambda u, v: jnp.sin(u) * v, lambda u, v: u - jnp.tanh(v), a, c)

    if op.name == "scan":
        def step(carry, row):
            carry = jnp.tanh(carry * b + row)
            return carry, carry * row

        _, ys = lax.scan(step, jnp.zeros((4,), dt), a, reverse=bool(op.param))
        return ys
    if op.name == "while":
        mode = prog.loop_mode
        opts = {"max_steps": {"max_steps": 8}, "checkpoints": {"checkpoints": 2}, "unbounded": {}}[mode]
        cf = c

        def body(carry):
            v, k = carry
            return v * jnp.asarray(0.8, dt) + jnp.asarray(0.2, dt) * jnp.sin(v) * cf, k + 1

        out, _ = jaxaot.loops.while_loop(lambda carry: carry[1] < n, body, (a, jnp.int32(0)), **opts)
        return out
    if op.name == "checkpoint":
        policy = jax.checkpoint_policies.dots_saveable if op.param else None
        return jax.checkpoint(lambda u, v: jnp.sin(u) * jnp.cos(v) + (u @ w) * v, policy=policy)(a, c)
    if op.name == "custom_jvp":
        return _swish(a)
    if op.name == "custom_vjp":
        return _sin_mul(a, c)
    if op.name == "dropout":
        keep = jax.random.bernoulli(_op_key(prog, key, i), 0.75, a.shape)
        return jnp.where(keep, a / jnp.asarray(0.75, dt), jnp.zeros_like(a))
    if op.name == "noise":
        return a + jax.random.normal(_op_key(prog, key, i), a.shape, dt) * jnp.asarray(0.1, dt)
    if op.name == "int_scale":
        return a * (n % 3 + 1).astype(dt)
    raise ValueError(op.name)


def _interpret(prog: Program, x, w, b, n, mask, key):
    pool = [x]
    for i, op in enumerate(prog.ops):
        pool.append(_apply(prog, op, i, pool, x, w, b, n, mask, key))
    loss = jnp.sum(pool[-1].astype(jnp.float32))
    for v in pool[1:-1:2]:  # a DAG: earlier values feed the loss too
        loss = loss + 0.1 * jnp.sum(jnp.square(v.astype(jnp.float32)))
    return loss


# ----------------------------------------------------------------------------- strategies
@st.composite
def ops(draw, key: str | None):
    names = [k for k in OPS if key is not None or k not in ("dropout", "noise")]
    name = draw(st.sampled_from(names))
    args = tuple(draw(st.integers(0, 7)) for _ in range(OPS[name]))
    param = None
    if name == "unary":
        param = draw(st.sampled_from(UNARY))
    elif name == "binary":
        param = draw(st.sampled_from(BINARY))
    elif name == "reduce":
        param = (draw(st.sampled_from(("sum", "max", "mean", "logsumexp"))), draw(st.sampled_from((0, 1))))
    elif name == "softmax":
        param = draw(st.sampled_from((0, 1)))
    elif name == "cond":
        param = draw(st.sampled_from(("int", "data")))
    elif name in ("scan", "checkpoint"):
        param = draw(st.booleans())
    return Op(name, args, param)


@st.composite
def programs(draw, max_ops: int = 7):
    key = draw(st.sampled_from((None, "typed", "raw")))
    return Program(
        dtype=draw(st.sampled_from(DTYPES)),
        ops=tuple(draw(st.lists(ops(key), min_size=1, max_size=max_ops))),
        key=key,
        loop_mode=draw(st.sampled_from(LOOP_MODES)),
        n=draw(st.integers(0, 5)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


# ----------------------------------------------------------------------------- the check
GRAD_ARGS = (0, 1, 2)


def assert_close(got: Any, want: Any, dtype: str, what: str) -> None:
    g_leaves, w_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(g_leaves) == len(w_leaves), f"{what}: {len(g_leaves)} leaves, expected {len(w_leaves)}"
    tol = TOL[dtype]
    for i, (g, e) in enumerate(zip(g_leaves, w_leaves)):
        g, e = np.asarray(g, np.float64), np.asarray(e, np.float64)
        assert g.shape == e.shape, f"{what} leaf {i}: shape {g.shape} != {e.shape}"
        # NaN and Inf must appear exactly where JAX has them.
        np.testing.assert_array_equal(np.isnan(g), np.isnan(e), err_msg=f"{what} leaf {i}: NaN pattern")
        np.testing.assert_array_equal(np.isinf(g), np.isinf(e), err_msg=f"{what} leaf {i}: Inf pattern")
        fin = np.isfinite(e)
        if fin.any():
            err = np.max(np.abs(g[fin] - e[fin]))
            scale = 1 + np.max(np.abs(e[fin]))
            assert err <= tol * scale, f"{what} leaf {i}: max error {err:.3g} > {tol} * {scale:.3g} ({dtype})"


def paths_for(prog: Program) -> tuple[str, ...]:
    if prog.unbounded:  # its stack is sized by the runtime: only eager calls
        return ("eager_value_and_grad", "jax_grad", "forward_backward")
    return PATHS


def check_program(prog: Program, partitioners=tuple(PARTITIONERS), paths: tuple[str, ...] | None = None,
                  pairs: Any = None) -> None:
    """Assert that jaxaot agrees with ``jax.value_and_grad`` on ``prog`` under each partitioner and path.

    ``pairs``: ``(partitioner, path)`` pairs to run instead of the full product.
    """
    fn = prog.fn()
    args = prog.inputs()
    # An unbounded loop differentiates only inside an eagerly called aot_function; its
    # forward never depends on the memory mode, so JAX's answer comes from a bounded copy.
    ref = dataclasses.replace(prog, loop_mode="max_steps").fn() if prog.unbounded else fn
    want = jax.jit(jax.value_and_grad(ref, argnums=GRAD_ARGS))(*args)
    if pairs is None:
        paths = paths_for(prog) if paths is None else paths
        pairs = [(pname, path) for pname in partitioners for path in paths]
    by_partitioner: dict[str, list[str]] = {}
    for pname, path in pairs:
        by_partitioner.setdefault(pname, []).append(path)
    want_vmap = None
    for pname, paths in by_partitioner.items():
        f = jaxaot.aot_function(fn, partition_fn=PARTITIONERS[pname])
        for path in paths:
            what = f"{pname}/{path}"
            if path == "eager_value_and_grad":
                got = jaxaot.value_and_grad(f, argnums=GRAD_ARGS)(*args)
            elif path == "jax_grad":
                got = jax.value_and_grad(f, argnums=GRAD_ARGS)(*args)
            elif path == "compiled_autograd":  # an eager forward around the region, its backward captured
                got = jaxaot.compiled_value_and_grad(f, argnums=GRAD_ARGS)(*args)
            elif path == "jit":
                got = jax.jit(jax.value_and_grad(f, argnums=GRAD_ARGS))(*args)
            elif path == "vmap":
                bargs = (prog.inputs(batch=2)[0],) + args[1:]
                axes = (0,) + (None,) * (len(args) - 1)
                if want_vmap is None:
                    want_vmap = jax.jit(jax.vmap(jax.value_and_grad(ref, argnums=GRAD_ARGS), in_axes=axes))(*bargs)
                got = jax.vmap(jax.value_and_grad(f, argnums=GRAD_ARGS), in_axes=axes)(*bargs)
                assert_close(got, want_vmap, prog.dtype, what)
                continue
            elif path == "forward_backward":
                value, res = f.forward(*args)
                grads = f.backward(res, jnp.float32(1))
                got = (value, tuple(grads[i] for i in GRAD_ARGS))
            elif path == "export_load":
                with tempfile.TemporaryDirectory() as d:
                    loaded = jaxaot.export.load(jaxaot.export.export(f, *args).save(os.path.join(d, "a")))
                    got = jax.value_and_grad(loaded, argnums=GRAD_ARGS)(*args)
            else:
                raise ValueError(path)
            assert_close(got, want, prog.dtype, what)
