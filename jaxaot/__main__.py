"""``python -m jaxaot``: the ``jaxaot`` command, run as the command's own ``__main__``."""
import runpy

runpy.run_module("jaxaot._src.cli", run_name="__main__", alter_sys=True)
