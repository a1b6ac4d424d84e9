"""Export the split programs with ``jax.export`` and load them without the source."""
