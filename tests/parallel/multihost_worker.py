"""One process of a two-process, data-parallel jaxaot training step (``jax.distributed`` on CPU).

Run by ``tests/parallel/test_multihost.py`` as ``python multihost_worker.py PROCESS_ID PORT``
(two processes, ids 0 and 1, on one machine); ``docs/multihost.md`` is the recipe
it follows. Each process:

1. gives itself 4 CPU devices (``XLA_FLAGS``, before jax is imported), picks the
   gloo CPU collectives and joins the coordinator at ``localhost:PORT``;
2. builds one global mesh over all 8 devices of both processes, replicated
   MLP params (``jax.make_array_from_callback``) and a batch split over
   ``data`` from the rows this process holds
   (``jax.make_array_from_process_local_data``);
3. runs three SGD steps through ``jaxaot.value_and_grad(jaxaot.aot_function(loss))``
   and through ``jax.jit(jax.value_and_grad(loss))``, and the explicit split
   (``f.forward`` / ``f.backward``) once, and checks that losses and gradients
   agree with each other and with a one-device computation on the whole batch,
   gathered to the host with ``multihost_utils.process_allgather``;
4. checks that a ``max_steps`` loop's overflow raises ``LoopOverflowError`` in every process, and that a
   Python-executor pipeline over both processes' devices is refused in every process;
5. prints its persistent-cache counts (``JAXAOT_CACHE_DIR``, where the test sets one), then
   ``OK process <id>: ...``, and shuts the distributed runtime down.
"""

from __future__ import annotations

import os
import re
import sys

NUM_PROCESSES = 2
LOCAL_DEVICES = 4

if __name__ == "__main__":  # not when pytest imports this file for its doctests: jax is loaded by then
    # Before jax is imported: XLA reads the device count once.
    os.environ["XLA_FLAGS"] = (re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                                      os.environ.get("XLA_FLAGS", ""))
                               + f" --xla_force_host_platform_device_count={LOCAL_DEVICES}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxaot  # noqa: E402

BATCH, D_IN, D_HIDDEN, D_OUT = 32, 16, 64, 4
STEPS, LR = 3, 0.1
TOL = dict(rtol=2e-5, atol=2e-6)


def loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean squared error of a two-layer gelu MLP."""
    h = jax.nn.gelu(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def host_data() -> tuple[dict, np.ndarray, np.ndarray]:
    """The global params and batch, the same in every process (one seed)."""
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((D_IN, D_HIDDEN), dtype=np.float32) / np.float32(4),
              "b1": np.zeros(D_HIDDEN, np.float32),
              "w2": rng.standard_normal((D_HIDDEN, D_OUT), dtype=np.float32) / np.float32(6)}
    return params, rng.standard_normal((BATCH, D_IN), dtype=np.float32), rng.standard_normal((BATCH, D_OUT),
                                                                                           dtype=np.float32)


def global_arrays(mesh: jax.sharding.Mesh, process_id: int) -> tuple[dict, jax.Array, jax.Array]:
    """Replicated params and a batch split over 'data', each process contributing its own rows."""
    params, x, y = host_data()
    replicated = NamedSharding(mesh, P())
    params = {k: jax.make_array_from_callback(v.shape, replicated, lambda idx, v=v: v[idx]) for k, v in params.items()}
    rows = slice(process_id * BATCH // NUM_PROCESSES, (process_id + 1) * BATCH // NUM_PROCESSES)
    batch = NamedSharding(mesh, P("data"))
    x = jax.make_array_from_process_local_data(batch, x[rows], (BATCH, D_IN))
    y = jax.make_array_from_process_local_data(batch, y[rows], (BATCH, D_OUT))
    return params, x, y


def to_host(tree: object) -> object:
    """Every leaf as one numpy array on every process."""
    return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))


def assert_close(a: object, b: object, what: str) -> None:
    """Leaf by leaf ``np.testing.assert_allclose``, naming ``what``."""
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, err_msg=f"{what} {jax.tree_util.keystr(path)}", **TOL)


def sgd(params: dict, grads: dict) -> dict:
    """One plain SGD update."""
    return jax.tree.map(lambda p, g: p - LR * g, params, grads)


def check_overflow_and_refusal(params: dict, x: jax.Array) -> None:
    """A loop that needs 3 iterations under ``max_steps=2`` raises in this process too, not only in the process
    holding the program's first device; a Python-executor pipeline over every process's devices is refused."""
    def looped(params, x):
        h, _ = jaxaot.loops.while_loop(lambda c: c[1] < 3, lambda c: (jnp.tanh(c[0] @ params["w1"][:, :D_IN]),
                                                                       c[1] + 1), (x, 0), max_steps=2)
        return jnp.mean(h ** 2)

    try:
        jaxaot.value_and_grad(jaxaot.aot_function(looped))(params, x)
    except jaxaot.errors.LoopOverflowError:
        pass
    else:
        raise AssertionError("the loop's overflow was not raised in this process")
    try:
        jaxaot.parallel.pipeline([lambda p, h: h, lambda p, h: h], lambda out, y: jnp.mean(out), num_microbatches=2,
                                 devices=[jax.devices()[0], jax.devices()[-1]], executor="python")
    except jaxaot.errors.InvalidValueError as err:
        assert "belongs to process" in str(err), err
    else:
        raise AssertionError("a Python-executor pipeline over two processes was not refused")


def main(process_id: int, port: int) -> None:
    """Join the job, run the steps, compare, print the OK line."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=NUM_PROCESSES,
                               process_id=process_id)
    assert jax.process_count() == NUM_PROCESSES and jax.device_count() == NUM_PROCESSES * LOCAL_DEVICES
    assert jax.local_device_count() == LOCAL_DEVICES
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
    params, x, y = global_arrays(mesh, process_id)

    f = jaxaot.aot_function(loss)
    aot_step = jaxaot.value_and_grad(f)
    jit_step = jax.jit(jax.value_and_grad(loss))
    # One device, whole batch: no collectives at all.
    hp, hx, hy = host_data()
    local = jax.local_devices()[0]
    ref_params = jax.device_put(hp, local)
    ref_step = jax.jit(jax.value_and_grad(loss))

    p_aot = p_jit = params
    losses = []
    for step in range(STEPS):
        (l_aot, g_aot), (l_jit, g_jit) = aot_step(p_aot, x, y), jit_step(p_jit, x, y)
        l_ref, g_ref = ref_step(ref_params, jax.device_put(hx, local), jax.device_put(hy, local))
        assert all(g.sharding.is_fully_replicated for g in jax.tree.leaves(g_aot)), "grads must stay replicated"
        h_aot, h_jit = to_host((l_aot, g_aot)), to_host((l_jit, g_jit))
        assert_close(h_aot, h_jit, f"step {step}: jaxaot vs jit")
        assert_close(h_aot, jax.device_get((l_ref, g_ref)), f"step {step}: jaxaot vs one device")
        losses.append(float(h_aot[0]))
        p_aot, p_jit, ref_params = sgd(p_aot, g_aot), sgd(p_jit, g_jit), sgd(ref_params, g_ref)

    # The explicit split: residuals stay split over the batch, one slice per device.
    out, res = f.forward(params, x, y)
    grads = f.backward(res, jnp.float32(1))
    assert_close(to_host((out, grads[0])), to_host(jit_step(params, x, y)), "forward/backward vs jit")
    split = [r for r in res.arrays if r.ndim and r.shape[0] == BATCH]
    assert split and all(r.addressable_shards[0].data.shape[0] == BATCH // jax.device_count() for r in split)
    assert losses[-1] < losses[0], losses
    check_overflow_and_refusal(params, x)
    print(f"cache {jaxaot.compilers.cache_stats()}", flush=True)
    print(f"OK process {process_id}: {jax.device_count()} devices in {jax.process_count()} processes, "
          f"losses {' '.join(f'{v:.6f}' for v in losses)}", flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
