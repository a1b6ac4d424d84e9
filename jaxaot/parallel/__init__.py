"""Multi-device programs on JAX's own SPMD engine: sharding helpers and pipeline schedules.

jaxaot does not distribute anything itself. Sharded programs are compiled for
the shardings JAX's arrays carry (``jax.sharding.NamedSharding`` on a
``jax.sharding.Mesh``); pipelines run each stage's split executables on its
own device or sub-mesh and move activations with ``jax.device_put``.
"""
