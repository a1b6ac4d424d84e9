import os

# Eight CPU devices for the sharding and pipeline tests: XLA reads this once, when
# jax first initialises its backends, so it is set before jax is imported. Tests
# that do not ask for a mesh run on device 0 as before.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402

# Exact f32 matmuls on every backend, so that comparisons against JAX's own
# answers are not limited by TF32 on GPUs.
jax.config.update("jax_default_matmul_precision", "highest")
