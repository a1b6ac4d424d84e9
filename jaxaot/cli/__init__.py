"""The ``jaxaot`` command (``jaxaot.cli.main:main``): ``demo``, ``inspect`` and ``version``.

``main`` reads the arguments and runs a command, ``demo`` writes the demo's
report, ``console`` prints progress and tables, ``demo_models`` holds the
small reference models the demo, benchmarks and notebooks use.
"""
