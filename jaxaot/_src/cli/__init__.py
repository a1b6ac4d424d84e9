"""The ``jaxaot`` command (``jaxaot._src.cli.main:main``, also ``python -m jaxaot``): ``demo``, ``inspect``, ``version``.

``main`` reads the arguments and runs a command (``commands``), ``demo``
writes the demo's report, ``inspect_json`` the document of ``inspect --json``
(``inspect --compare`` prints :func:`jaxaot.compare`'s), ``shapes`` reads
``--shapes``, ``demo_models`` holds the small reference models the demo,
benchmarks and notebooks use. Tables print through :mod:`jaxaot._src.tables`,
progress through :mod:`jaxaot._src.progress`.

:func:`command` is the command itself (:func:`jaxaot._src.cli.main.main`); importing
this package imports only the standard library.
"""

from jaxaot._src.cli.main import main as command

__all__ = ["command"]
