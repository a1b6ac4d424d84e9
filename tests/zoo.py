"""A zoo of functions the core must handle, each with a fresh-random-input maker, and the helpers tests share.

``ZOO`` maps a name to ``(fn, make_args)`` where ``make_args(key)`` draws new
random inputs. Tests compare jaxaot against JAX's own answers on them.

Shared by several suites: :func:`layer_norm`, :func:`mlp_gelu`,
:func:`deep_mlp` and :func:`transformer_block` (the offload and policy tests'
models, with their ``*_args``), :func:`random_tree` / :func:`sds` /
:func:`key_stream` (fresh inputs for a pytree of shapes),
:func:`assert_trees_close`, and :func:`backward_inputs`. The larger models (Llama, GPT-2, MoE, ViT, ...) are
``benchmarks/models.py``'s, through ``tests/zoo_models.py``.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from benchmarks.models import layer_norm


def _normal(key, *shape, dtype=jnp.float32):
    return jax.random.normal(key, shape, dtype)


def mlp_gelu(params, x):
    for w, b in params:
        x = jax.nn.gelu(x @ w + b)
    return jnp.mean(x**2)


def mlp_args(key):
    ks = jax.random.split(key, 5)
    params = [(_normal(ks[0], 6, 8), _normal(ks[1], 8)), (_normal(ks[2], 8, 4), _normal(ks[3], 4))]
    return (params, _normal(ks[4], 5, 6))


def deep_mlp(params, x):
    """``len(params)`` gelu layers without bias; the mean square of the output."""
    for w in params:
        x = jax.nn.gelu(x @ w)
    return jnp.mean(x ** 2)


def deep_mlp_args(layers=8, width=256, batch=256, seed=0):
    """``(weights, x)`` for :func:`deep_mlp`: ``layers`` square weights of scale 1/16 and a batch, from ``key(seed)``."""
    ks = jax.random.split(jax.random.key(seed), layers + 1)
    return [jax.random.normal(k, (width, width)) / 16 for k in ks[:-1]], jax.random.normal(ks[-1], (batch, width))


def scanned_mlp(ws, x):
    """:func:`deep_mlp` with its layers stacked (``ws``: ``(layers, width, width)``) and run by ``lax.scan``."""
    x, _ = lax.scan(lambda h, w: (jax.nn.gelu(h @ w), None), x, ws)
    return jnp.mean(x ** 2)


def transformer_block(p, x, heads=4):
    """A pre-norm transformer block (fused QKV projection, ``heads``-head softmax attention, gelu MLP, parameter-free
    norms) on ``x`` of shape ``(batch, seq, width)``; the mean square of its output."""

    def norm(h):
        h = h - h.mean(-1, keepdims=True)
        return h * jax.lax.rsqrt((h * h).mean(-1, keepdims=True) + 1e-5)

    b, t, d = x.shape
    q, k, v = jnp.split(norm(x) @ p["qkv"], 3, axis=-1)
    split = lambda z: z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)  # noqa: E731
    s = jnp.einsum("bhqd,bhkd->bhqk", split(q), split(k)) / np.sqrt(d // heads)
    a = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), split(v)).transpose(0, 2, 1, 3).reshape(b, t, d)
    x = x + a @ p["out"]
    x = x + jax.nn.gelu(norm(x) @ p["up"]) @ p["down"]
    return jnp.mean(x ** 2)


def transformer_args(batch=4, seq=64, width=128, seed=1):
    """``(params, x)`` for :func:`transformer_block`, fan-in scaled, from ``key(seed)``."""
    ks = jax.random.split(jax.random.key(seed), 5)
    p = {"qkv": jax.random.normal(ks[0], (width, 3 * width)) / np.sqrt(width),
         "out": jax.random.normal(ks[1], (width, width)) / np.sqrt(width),
         "up": jax.random.normal(ks[2], (width, 4 * width)) / np.sqrt(width),
         "down": jax.random.normal(ks[3], (4 * width, width)) / np.sqrt(4 * width)}
    return p, jax.random.normal(ks[4], (batch, seq, width))


def ln_args(key):
    ks = jax.random.split(key, 3)
    return (_normal(ks[0], 4, 8), _normal(ks[1], 8), _normal(ks[2], 8))


def attention(q, k, v):
    s = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(q.shape[-1])
    return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), v)


def attn_args(key):
    ks = jax.random.split(key, 3)
    return tuple(_normal(k, 2, 5, 4) for k in ks)


def conv(x, w):
    y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jax.nn.relu(y).sum()


def conv_args(key):
    ks = jax.random.split(key, 2)
    return (_normal(ks[0], 2, 6, 6, 3), _normal(ks[1], 3, 3, 3, 4))


def scan_rnn(w, xs):
    def step(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h.sum()

    h, ys = lax.scan(step, jnp.zeros(xs.shape[1:]), xs)
    return h, ys


def scan_args(key):
    ks = jax.random.split(key, 2)
    return (_normal(ks[0], 4, 4) * 0.5, _normal(ks[1], 7, 3, 4))


def cond_fn(x, y):
    return lax.cond(x.sum() > 0, lambda a, b: jnp.sin(a) * b, lambda a, b: a * jnp.cos(b), x, y)


def two_args(key):
    ks = jax.random.split(key, 2)
    return (_normal(ks[0], 3), _normal(ks[1], 3))


def checkpointed(x, w):
    f = jax.checkpoint(lambda x: jnp.sin(x @ w) @ w)
    return jnp.tanh(f(x)).sum()


def ckpt_args(key):
    ks = jax.random.split(key, 2)
    return (_normal(ks[0], 3, 4), _normal(ks[1], 4, 4))


@jax.custom_jvp
def softplus(x):
    return jnp.log1p(jnp.exp(x))


@softplus.defjvp
def _softplus_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return softplus(x), t * jax.nn.sigmoid(x)


def custom_jvp_fn(x, y):
    return softplus(x * y).sum()


def int_outputs(x, n):
    return jnp.argmax(x), x * n, n + 1


def int_args(key):
    return (_normal(key, 5), jnp.int32(3))


def pytree_outputs(d):
    return {"a": jnp.sin(d["x"]), "b": (d["x"] * d["y"], jnp.exp(d["y"]).sum())}


def pytree_args(key):
    ks = jax.random.split(key, 2)
    return ({"x": _normal(ks[0], 3), "y": _normal(ks[1], 3)},)


def unused_input(x, unused):
    return jnp.sin(x).sum()


def independent_output(x):
    return jnp.sin(x), jnp.arange(3.0) * 2.0


def one_arg(key):
    return (_normal(key, 3),)


def output_is_input(x, y):
    return x, x * y, y


ZOO = {
    "mlp_gelu": (mlp_gelu, mlp_args),
    "layer_norm": (layer_norm, ln_args),
    "attention": (attention, attn_args),
    "conv": (conv, conv_args),
    "scan": (scan_rnn, scan_args),
    "cond": (cond_fn, two_args),
    "checkpoint": (checkpointed, ckpt_args),
    "custom_jvp": (custom_jvp_fn, two_args),
    "int_outputs": (int_outputs, int_args),
    "pytree_outputs": (pytree_outputs, pytree_args),
    "unused_input": (unused_input, two_args),
    "independent_output": (independent_output, one_arg),
    "output_is_input": (output_is_input, two_args),
}


def sds(*shape, dtype=jnp.float32):
    """A ``jax.ShapeDtypeStruct`` (float32 by default), for :func:`random_tree`'s shapes."""
    return jax.ShapeDtypeStruct(shape, dtype)


def random_tree(key: jax.Array, shapes, scale: float = 0.3):
    """Fresh normal values for a pytree of ``ShapeDtypeStruct``: one draw, cut on the host (one compile per size)."""
    leaves, treedef = jax.tree_util.tree_flatten(shapes)
    sizes = [int(np.prod(a.shape)) for a in leaves]
    flat = np.asarray(jax.random.normal(key, (sum(sizes),))) * scale
    parts = np.split(flat, np.cumsum(sizes)[:-1])
    return jax.tree_util.tree_unflatten(treedef, [jnp.asarray(p.reshape(a.shape)) for p, a in zip(parts, leaves)])


def key_stream(start: int) -> Callable[[], jax.Array]:
    """``fresh_key()`` giving a new key per call: seeds ``start, start + 1, ...``, each offset by a random draw
    (so reruns see other inputs; a failure's inputs differ from run to run)."""
    seeds = itertools.count(start)

    def fresh_key() -> jax.Array:
        return jax.random.key(next(seeds) + np.random.randint(1 << 20))

    return fresh_key


#: Added to the seeds of :func:`normal_at`: drawn once per process, so a seed names one input within a run and
#: reruns see other inputs.
_SEED_OFFSET = np.random.randint(1 << 20)


def normal_at(seed: int, shape: tuple) -> jax.Array:
    """A standard normal array for ``seed``: the same within a process, another in the next run."""
    return jax.random.normal(jax.random.key(seed + _SEED_OFFSET), shape)


def trees_close(a, b, atol: float = 1e-5) -> bool:
    """Whether two trees have one structure and leaves equal within ``atol`` (``assert trees_close(...)``)."""
    if jax.tree.structure(a) != jax.tree.structure(b):
        return False
    return all(bool(jnp.allclose(p, q, atol=atol)) for p, q in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def random_cotangents(key, outs):
    """A cotangent per output leaf: random for inexact leaves, float0 for the rest."""
    leaves, tree = jax.tree_util.tree_flatten(outs)
    keys = jax.random.split(key, max(len(leaves), 1))
    cts = []
    for k, x in zip(keys, leaves):
        if jnp.issubdtype(x.dtype, jnp.inexact):
            cts.append(jax.random.normal(k, x.shape, x.dtype))
        else:
            cts.append(jax.numpy.zeros(x.shape, jax.dtypes.float0))
    return jax.tree_util.tree_unflatten(tree, cts)


def backward_inputs(part, args, key):
    """``(cotangents, residuals)`` for the partition ``part``'s backward: its forward run on ``args``,
    a random cotangent per differentiated output."""
    from jaxaot._src import compat as C

    leaves = jax.tree.leaves(args)
    fwd = C.eval_closed(part.forward, *leaves)
    residuals = [leaves[i] for i in part.saved_inputs] + [fwd[i] for i in part.saved_outputs]
    cts = [jax.random.normal(jax.random.fold_in(key, i), fwd[i].shape, fwd[i].dtype)
           for i in part.cotangent_outputs]
    return cts, residuals


def assert_trees_close(actual, expected, rtol=2e-5, atol=2e-5):
    """chex.assert_trees_all_close that also accepts float0 leaves (compared by shape)."""
    import chex

    def split(tree):
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        f0 = [getattr(x, "dtype", None) == jax.dtypes.float0 for x in leaves]
        return treedef, [x for x, z in zip(leaves, f0) if not z], [x.shape for x, z in zip(leaves, f0) if z]

    ta, la, sa = split(actual)
    te, le, se = split(expected)
    assert ta == te, f"tree structures differ: {ta} vs {te}"
    assert sa == se, f"float0 leaves differ: {sa} vs {se}"
    chex.assert_trees_all_close(la, le, rtol=rtol, atol=atol)


def child_env() -> dict:
    """The environment of a fresh Python that finds jaxaot also when it is not installed (PYTHONPATH=.)."""
    import os
    from pathlib import Path

    import jaxaot

    root = str(Path(jaxaot.__file__).resolve().parents[1])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))


def free_port() -> int:
    """A localhost TCP port nobody listens on now: a ``jax.distributed`` coordinator's."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_processes(commands: list[list[str]], cwd: Any, envs: list[dict], timeout: float) -> list[str]:
    """Start one process per command (with its environment) at once, wait for all, and return their
    stdouts after checking each exited 0; a process left waiting for its peers is killed, never left
    behind the test."""
    import subprocess

    procs = [subprocess.Popen(c, cwd=cwd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c, e in zip(commands, envs)]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append((p.returncode, out, err))
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                p.kill()
        errs = [p.communicate()[1] for p in procs]
        tails = [f"process {i} ({'killed' if p.returncode < 0 else f'exited {p.returncode}'}):\n{err[-2000:]}"
                 for i, (p, err) in enumerate(zip(procs, errs))]
        raise AssertionError(f"{len(procs)} processes still running after {timeout} s (one waiting for its peers, "
                             "or a coordinator port taken by another process?); their stderr:\n"
                             + "\n".join(tails)) from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for i, (rc, out, err) in enumerate(results):
        assert rc == 0, f"process {i} of {commands[i]} exited {rc}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-4000:]}"
    return [out for _, out, _ in results]


def body_runs_and_gradient(n: int, x: float, **loop_options) -> tuple[int, Any, Any]:
    """``(body evaluations, gradient, lax.fori_loop's gradient)`` of one compiled ``jax.grad`` through
    ``jaxaot.loops.while_loop`` of ``n`` steps of ``v -> sin(v) * 1.1`` with ``loop_options``.

    The body counts its runs with a ``jax.debug.callback``; tracing and compiling run none, so the
    count is the execution's alone.
    """
    from jaxaot._src.loops.wrappers import while_loop

    calls = [0]

    def count():
        calls[0] += 1

    def body(c):
        jax.debug.callback(count)
        return c[0] + 1, jnp.sin(c[1]) * 1.1

    g = jax.jit(jax.grad(lambda v: while_loop(lambda c: c[0] < n, body, (0, v), **loop_options)[1]))
    g = g.lower(x).compile()
    calls[0] = 0
    got = g(x)
    jax.effects_barrier()
    ref = jax.grad(lambda v: lax.fori_loop(0, n, lambda i, u: jnp.sin(u) * 1.1, v))(x)
    return calls[0], got, ref


def finish_tuning(f: Any, args: tuple, kwargs: dict | None = None) -> int:
    """Make the fused step's choices that the calls after the first still make for ``f``'s signature at ``args``
    (:class:`~jaxaot._src.fusion.Tuning`): its variants' compiles waited for, then the calls that time fused
    against split run on ``args``, as the user's next calls would. The number of such calls."""
    programs, leaves, _ = f.lookup(args, kwargs or {})
    calls = 0
    for tuning in list(programs.tunings.values()):
        tuning.wait()
        while programs.tunings.get(tuning.name) is tuning:
            tuning.run(list(leaves))
            calls += 1
            assert calls < 100, "a tuning that never ends"
    return calls


def kept_step(f: Any, args: tuple, kwargs: dict | None = None) -> Any:
    """The :class:`~jaxaot._src.fusion.FusedChoice` of ``f``'s signature for ``args``, after ``jaxaot.value_and_grad``
    ran it, checking that the signature keeps only the step that runs: the fused executable alone, or
    the split forward and backward alone. Which one runs is the platform's choice (timed on accelerators),
    so tests of the fused step's variants read the variant from the choice, which outlives a losing step.
    A choice the calls after the first still make (``jaxaot.config.tune_in_background``) is made first, by
    :func:`finish_tuning`.
    """
    finish_tuning(f, args, kwargs)
    programs = f.lookup(args, kwargs or {}).programs
    (choice,) = programs.fused_choices.values()
    assert choice.runs in ("fused", "split"), choice
    suffix = choice.executable.removeprefix("fused").split("@")[0]  # the gradient mask's, as in "fused[0,1]"
    kept = {choice.executable} if choice.runs == "fused" else {"forward" + suffix, "backward" + suffix}
    assert set(programs.executables) == kept, (tuple(programs.executables), choice)
    return choice
