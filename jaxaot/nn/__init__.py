"""Flax support: ``aot_module`` and module export (imports flax)."""
