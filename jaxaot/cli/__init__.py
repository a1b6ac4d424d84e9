"""The ``jaxaot`` command."""
