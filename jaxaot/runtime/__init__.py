"""Stage 4, runtime: ``aot_function`` and the per-signature programs it runs."""
