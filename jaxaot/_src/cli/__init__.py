"""The ``jaxaot`` command (``jaxaot._src.cli.main:main``): ``demo``, ``inspect`` and ``version``.

``main`` reads the arguments and runs a command (``commands``), ``demo``
writes the demo's report, ``inspect_json`` the document of ``inspect --json``,
``console`` prints tables (progress goes through :mod:`jaxaot._src.progress`),
``demo_models`` holds the small reference models the demo, benchmarks and
notebooks use.
"""
