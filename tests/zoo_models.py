"""The broader model zoo at test size: the models of ``benchmarks/models.py``.

The definitions live in ``benchmarks/models.py`` (one copy, three sizes, imported as
``from benchmarks import models``: pytest puts the repository root on ``sys.path``); this
module exposes the ``"tiny"`` size:

``MODELS``: name -> :class:`Model` (``loss``, ``make_args``, ``argnums``, ``dtype``, ``label``).

They are not merged into ``zoo.ZOO``: several are bf16 by design and the
suites over ``ZOO`` compare at float32 tolerances;
``tests/partition/test_zoo_budgets.py`` tests them with dtype-aware tolerances.
"""

from __future__ import annotations

from typing import Any

from benchmarks import models

Model = models.Model

#: name -> Model, tiny shapes (a few thousand parameters; float32 except the bf16 GPT-2 blocks).
MODELS: dict[str, Any] = models.zoo("tiny")
