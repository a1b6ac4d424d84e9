"""How much of a host copy compute hides on this device (the ``overlap`` of ``jaxaot.DeviceModel``).

Prints the measured model, then, for payloads of 16-256 MiB each way, the copy
alone, a matmul chain about as long alone, and both in one program, and the
fraction of the copy hidden. Usage: ``python benchmarks/probe_copy_overlap.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxaot.partition import device_model as dm


def main() -> None:
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}")
    model = dm.DeviceModel.measure()
    print(model)
    dev = jax.devices()[0]
    on_device = jax.sharding.SingleDeviceSharding(dev)
    on_host = on_device.with_memory_kind(dm.HOST_MEMORY_KIND)
    n = 8192
    a = jax.device_put(jnp.ones((n, n), jnp.bfloat16), on_device)
    to_host = jax.jit(lambda v: v, out_shardings=on_host)
    to_device = jax.jit(lambda v: v, out_shardings=on_device)
    print(f"{'MiB':>5} {'way':>8} {'copy ms':>8} {'steps':>6} {'hidden':>7}")
    for mib in (16, 64, 256):
        x = jax.device_put(np.zeros(mib * 2**18, np.float32), on_device)
        h = to_host(x)
        for way, payload, dest, fn in (("to host", x, on_host, to_host), ("to dev", h, on_device, to_device)):
            copy = dm.best_seconds(lambda: fn(payload))
            steps = max(2, round(copy / (2.0 * n**3 / model.device_flops)))
            hidden = dm._overlap(a, payload, copy, on_device, dest, steps)
            print(f"{mib:>5} {way:>8} {copy * 1e3:>8.3f} {steps:>6} {hidden:>7.2f}")
    try:
        moved, saved, copy = dm.scan_copy_seconds(a, model.device_flops, model.host_bandwidth, model.transfer_latency)
        print(f"in a scan, 8 iterations, one 16 MiB slice each way per iteration (one copy {copy * 1e3:.3f} ms): "
              f"gradient {moved * 1e3:.3f} ms offloaded, {saved * 1e3:.3f} ms saved on the device: "
              f"{(moved - saved) / (16 * copy):.2f} of the copies' time added")
    except Exception as e:  # noqa: BLE001
        print(f"in a scan: JAX's offload policy fails: {type(e).__name__}: {str(e)[:300]}")


if __name__ == "__main__":
    main()
