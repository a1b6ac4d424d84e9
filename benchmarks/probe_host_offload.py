"""Probe: which nested-scan + offload-policy structures XLA's GPU compiler accepts.

Variants of the offline schedule's structure (levels of scans, each chunk under
jax.checkpoint with a policy that offloads its named carry to pinned_host), with
and without the top-level lax.cond, the innermost unroll, and a masked step.
Prints, per variant, whether jit(grad) compiles and runs, the gradient's error
against plain jax.grad of a scan, and the compiled host / device temporaries.
"""
from __future__ import annotations

import functools
import sys
import traceback

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name


def policy(name):
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=(), names_which_can_be_offloaded=(name,), offload_src="device",
        offload_dst="pinned_host")


def make(sizes, use_cond, unroll, masked, name_what):
    def step(state, _):
        x, w, n, i = state
        y = x + 0.05 * (jnp.tanh(x @ w) - x)
        if masked:
            y = jnp.where(i < n, y, x)
        return (y, w, n, i + 1), None

    def level(depth, state):
        if depth == len(sizes) - 1:
            return lax.scan(step, state, None, length=sizes[depth], unroll=unroll)[0]
        nm = f"snap{depth}"

        def named(s):
            if name_what == "x":
                s = (checkpoint_name(s[0], nm), *s[1:])
            else:
                s = checkpoint_name(s, nm)
            return level(depth + 1, s)
        if depth == 0 and use_cond == "inside":
            def named_cond(s, named=named):
                return lax.cond(s[3] < s[2], named, lambda t: t, s)
            inner = jax.checkpoint(named_cond, prevent_cse=False, policy=policy(nm))
        else:
            inner = jax.checkpoint(named, prevent_cse=False, policy=policy(nm))
        if depth == 0 and use_cond is True:
            chunk = lambda s, _: (lax.cond(s[3] < s[2], inner, lambda t: t, s), None)  # noqa: E731
        else:
            chunk = lambda s, _: (inner(s), None)  # noqa: E731
        return lax.scan(chunk, state, None, length=sizes[depth])[0]

    def loss(x, w, n):
        return jnp.sum(level(0, (x, w, n, jnp.int32(0)))[0] ** 2)
    return loss


def ref(x, w, n_total):
    return jnp.sum(lax.scan(lambda c, _: (c + 0.05 * (jnp.tanh(c @ w) - c), None), x, None, length=n_total)[0] ** 2)


CONDS = ["inside"] if "--inside" in sys.argv else [False, True, "inside"]
NAMES = ["x"] if "--inside" in sys.argv else ["x", "state"]


def main():
    x = jax.random.normal(jax.random.key(0), (256, 1024))
    w = jax.random.normal(jax.random.key(1), (1024, 1024)) / 32
    for sizes in [(8, 16), (4, 8, 16)]:
        n = 1
        for s in sizes:
            n *= s
        g_ref = jax.jit(jax.grad(ref), static_argnums=2)(x, w, n)
        for use_cond in CONDS:
            for unroll in (1, 16):
                for masked in (False, True):
                    for name_what in NAMES:
                        tag = f"sizes={sizes} cond={use_cond} unroll={unroll} masked={masked} name={name_what}"
                        try:
                            f = jax.jit(jax.grad(make(sizes, use_cond, unroll, masked, name_what)))
                            c = f.lower(x, w, jnp.int32(n)).compile()
                            g = c(x, w, jnp.int32(n))
                            err = float(jnp.linalg.norm(g - g_ref) / jnp.linalg.norm(g_ref))
                            m = c.memory_analysis()
                            print(f"OK   {tag}: err {err:.1e} temp {m.temp_size_in_bytes/2**20:.0f} MiB "
                                  f"host temp {m.host_temp_size_in_bytes/2**20:.0f} MiB S(5) {c.as_text().count('S(5)')}",
                                  flush=True)
                        except Exception as e:  # noqa: BLE001
                            msg = str(e).replace("\n", " ")
                            print(f"FAIL {tag}: {type(e).__name__}: {msg[:600]}", flush=True)


if __name__ == "__main__" and "--jaxaot" not in sys.argv:
    main()


def jaxaot_error():
    """The full error of jaxaot's own host schedule, if it fails."""
    import jaxaot
    x = jax.random.normal(jax.random.key(0), (256, 1024))
    w = jax.random.normal(jax.random.key(1), (1024, 1024)) / 32

    def loss(x, w, n):
        out = jaxaot.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] + 0.05 * (jnp.tanh(c[1] @ w) - c[1])),
                                (jnp.int32(0), x), max_steps=500, checkpoints=40, checkpoint_memory="host")
        return jnp.sum(out[1] ** 2)
    try:
        jax.jit(jax.grad(loss))(x, w, jnp.int32(300)).block_until_ready()
        print("jaxaot host: OK")
    except Exception as e:  # noqa: BLE001
        print("jaxaot host FAIL:", str(e)[:2500])


if __name__ == "__main__" and "--jaxaot" in sys.argv:
    jaxaot_error()
