"""One process of a two-process compiled pipeline: 4 stages by 2 data shards over ``jax.distributed`` on CPU.

Run by ``tests/parallel/test_multihost.py`` as ``python pipeline_multihost_worker.py PROCESS_ID PORT``
(two processes on one machine). Each process:

1. gives itself 4 CPU devices, picks the gloo CPU collectives and joins the coordinator;
2. builds one ``(stage, data)`` mesh of shape (4, 2) over all 8 devices (stages 0 and 1 live on process 0,
   stages 2 and 3 on process 1);
3. packs the same host parameters (one seed) with ``step.shard_params``: each process fills its own devices;
4. runs two SGD steps of the 1F1B and zero-bubble pipelines on the packed parameters, gathers loss and
   gradients to the host (``multihost_utils.process_allgather``) and checks them against
   ``jax.value_and_grad`` of the unpipelined model on one local device;
5. prints ``OK process <id>: ...`` with the losses and shuts the distributed runtime down.
"""

from __future__ import annotations

import os
import re
import sys

NUM_PROCESSES = 2
LOCAL_DEVICES = 4

if __name__ == "__main__":  # not when pytest imports this file for its doctests
    os.environ["XLA_FLAGS"] = (re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                                      os.environ.get("XLA_FLAGS", ""))
                               + f" --xla_force_host_platform_device_count={LOCAL_DEVICES}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import jaxaot  # noqa: E402

STAGES, DATA, MICROBATCHES, BATCH, WIDTH, VOCAB = 4, 2, 4, 16, 8, 12
LR = 0.1
TOL = dict(rtol=1e-5, atol=1e-6)


def stage_fn(p: dict, x: jax.Array) -> jax.Array:
    """Embeds tokens on the first stage, a tanh layer everywhere, logits on the last."""
    if "emb" in p:
        x = p["emb"][x]
    x = jnp.tanh(x @ p["w"] + p["b"])
    return x @ p["head"] if "head" in p else x


def loss_fn(logits: jax.Array, t: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, t[:, None], axis=-1))


def host_data() -> tuple[list, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    params = [{"w": rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) / 3,
               "b": rng.standard_normal(WIDTH, dtype=np.float32) / 3} for _ in range(STAGES)]
    params[0]["emb"] = rng.standard_normal((VOCAB, WIDTH), dtype=np.float32)
    params[-1]["head"] = rng.standard_normal((WIDTH, VOCAB), dtype=np.float32) / 3
    return params, rng.integers(0, VOCAB, BATCH), rng.integers(0, VOCAB, BATCH)


def reference(params: list, x: np.ndarray, t: np.ndarray) -> tuple:
    def loss(params, x, t):
        def one(xm, tm):
            for p in params:
                xm = stage_fn(p, xm)
            return loss_fn(xm, tm)
        return jnp.mean(jax.vmap(one)(x.reshape(MICROBATCHES, -1), t.reshape(MICROBATCHES, -1)))
    local = jax.local_devices()[0]
    args = jax.device_put((params, x, t), local)
    return jax.device_get(jax.jit(jax.value_and_grad(loss))(*args))


def main(process_id: int, port: int) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=NUM_PROCESSES,
                               process_id=process_id)
    assert jax.device_count() == NUM_PROCESSES * LOCAL_DEVICES
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(STAGES, DATA), ("stage", "data"))
    params, x, t = host_data()
    losses = []
    for schedule in ("1f1b", "zero_bubble"):
        step = jaxaot.parallel.pipeline([stage_fn] * STAGES, loss_fn, schedule=schedule, num_microbatches=MICROBATCHES,
                               mesh=mesh)
        packed = step.shard_params(params, x, t)
        want_params = params
        for k in range(2):
            loss, grads = step(packed, x, t)
            entries = [np.asarray(e) for e in multihost_utils.process_allgather(grads.entries, tiled=True)]
            lay, where = grads.layout, step.schedule.stage_device()
            got = [jax.tree_util.tree_unflatten(grads.treedefs[s], lay.read(s, [e[where[s]] for e in entries]))
                   for s in range(STAGES)]
            want_loss, want_grads = reference(want_params, x, t)
            np.testing.assert_allclose(float(loss), want_loss, err_msg=f"{schedule} step {k} loss", **TOL)
            for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(want_grads)):
                np.testing.assert_allclose(a, b, err_msg=f"{schedule} step {k} {jax.tree_util.keystr(path)}", **TOL)
            losses.append(float(loss))
            packed = jax.tree.map(lambda p, g: p - LR * g, packed, grads)
            want_params = jax.tree.map(lambda p, g: p - LR * g, want_params, want_grads)
    print(f"OK process {process_id}: {jax.device_count()} devices in {jax.process_count()} processes, "
          f"pipeline losses {' '.join(f'{v:.6f}' for v in losses)}", flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
