"""``python -m jaxaot``: the ``jaxaot`` command (:func:`jaxaot._src.cli.command`)."""
import sys

from jaxaot._src.cli import command

sys.exit(command())
