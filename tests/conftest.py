import os
import sys

import jax

sys.path.insert(0, os.path.dirname(__file__))

# Exact f32 matmuls on every backend, so that comparisons against JAX's own
# answers are not limited by TF32 on GPUs.
jax.config.update("jax_default_matmul_precision", "highest")
