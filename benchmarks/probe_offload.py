"""Probe of issue 16 (offload to host memory): correctness, HLO, memory analysis and step time.

Per model (an 8-layer MLP, the zoo's Llama block, the issue's GPT-2 block and
the 12-layer scanned GPT), for the min-cut partition without and with
``offload="auto"`` (the measured :class:`~jaxaot.partition.offload.DeviceModel`):
saved and device bytes, how many residuals went to ``pinned_host``, the
``annotate_device_placement`` calls in the StableHLO, the compiled programs'
host memory, the split and fused step times (median of 10) and the largest
gradient error against ``jax.jit(jax.value_and_grad)``; then JAX's fused step
and its ``offload_dot_with_no_batch_dims`` checkpoint policy.

Usage: ``PYTHONPATH=. python benchmarks/probe_offload.py`` on a GPU (``ONLY=mlp8x4096,llama_block``
to choose; ``SIZE=small``: CPU sizes with a synthetic device model). Writes ``$OUT/probe.txt``.
Not a benchmark of record: no interleaved rounds, no input cycling (see ``bench_planner.py``).
"""
import functools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxaot  # noqa: E402
import models as zoo_models  # noqa: E402
from jaxaot.partition.rematerialize import min_cut_rematerialization_partition as mc  # noqa: E402
from jaxaot.partition.offload import DeviceModel  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
log = open(os.path.join(OUT, "probe.txt"), "w")


def say(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    log.write(s + "\n")
    log.flush()


say(jax.__version__, jax.devices(), [m.kind for m in jax.devices()[0].addressable_memories()])
t = time.perf_counter()
dm = DeviceModel.measure()
say(f"measure {time.perf_counter() - t:.2f}s", dm)


def med(fn, n=10):
    jax.block_until_ready(fn())
    jax.block_until_ready(fn())
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def mlp_model():
    def loss(params, x):
        for w in params:
            x = jax.nn.gelu(x @ w)
        return jnp.mean(x.astype(jnp.float32) ** 2)

    def make_args(key):
        ks = jax.random.split(key, 9)
        n, b = (256, 256) if SMALL else (4096, 8192)
        return ([(jax.random.normal(k, (n, n)) / n**0.5).astype(jnp.bfloat16) for k in ks[:8]],
                jax.random.normal(ks[8], (b, n)).astype(jnp.bfloat16))
    return "mlp8x4096", loss, make_args, (0, 1)


SMALL = os.environ.get("SIZE") == "small"
zoo = zoo_models.zoo("small" if SMALL else "gpu")
cases = [mlp_model()] + [(m.name, m.loss, m.make_args, m.argnums) for m in
                         (zoo["llama_block"], zoo["issue_block"], zoo["gpt_scanned"])]
only = os.environ.get("ONLY")
policy = jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")
for name, loss, make_args, argnums in cases:
    if only and name not in only.split(","):
        continue
    try:
        args = make_args(jax.random.key(0))
        ref = jax.jit(jax.value_and_grad(loss, argnums=argnums))
        want = ref(*args)
        res = {}
        for tag, kw in (("mincut", {}), ("offload", {"offload": "auto"} if not SMALL else {"offload": True, "device_model": DeviceModel(5e9, 1e12)})):
            t = time.perf_counter()
            f = jaxaot.aot_function(loss, partition_fn=functools.partial(mc, **kw))
            low = f.lower(*args)
            n_off = sum(r.offloaded for r in low.saved)
            say(f"{name} {tag}: saved {low.saved_bytes/2**20:.1f} MiB device {low.device_saved_bytes/2**20:.1f} MiB "
                f"offloaded {n_off} {low.partition.offload_note!r} partition {low.compile_times['partition']:.2f}s")
            if n_off:
                text = low.as_text()
                say("  annotate_device_placement fwd/bwd:", text["forward"].count("annotate_device_placement"),
                    text["backward"].count("annotate_device_placement"))
                ma = low.compile().memory_analysis()
                say("  forward host_output", ma["forward"]["host_output_size_in_bytes"], "output",
                    ma["forward"]["output_size_in_bytes"], "| backward host_argument",
                    ma["backward"]["host_argument_size_in_bytes"], "argument", ma["backward"]["argument_size_in_bytes"],
                    "peak fwd/bwd", ma["forward"]["peak_memory_in_bytes"], ma["backward"]["peak_memory_in_bytes"])
            for mode, vg in (("split", jaxaot.value_and_grad(f, argnums=argnums, fused=False)),
                             ("fused", jaxaot.value_and_grad(f, argnums=argnums))):
                got = vg(*args)
                err = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))) /
                                (float(jnp.max(jnp.abs(b.astype(jnp.float32)))) + 1e-30))
                          for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
                res[f"{tag}_{mode}"] = med(lambda: vg(*args))
                say(f"  {tag} {mode}: {res[f'{tag}_{mode}']:.3f} ms, max rel err vs jax {err:.2e}")
            say(f"  ({time.perf_counter() - t:.1f}s)")
        res["jax_fused"] = med(lambda: ref(*args))
        off = jax.jit(jax.value_and_grad(jax.checkpoint(loss, policy=policy), argnums=argnums))
        res["jax_offload_dots"] = med(lambda: off(*args))
        say(f"  jax fused {res['jax_fused']:.3f} ms, jax offload_dot_with_no_batch_dims {res['jax_offload_dots']:.3f} ms")
    except Exception as e:  # keep probing the others
        say(f"{name} FAILED: {type(e).__name__}: {str(e)[:1500]}")
