"""The broader model zoo at test size: the models of ``benchmarks/models.py``.

The definitions live in ``benchmarks/models.py`` (one copy, three sizes); this
module loads that file under a private module name, so that nothing named
``models`` lands on ``sys.path``, and exposes the ``"tiny"`` size:

* ``MODELS``: name -> :class:`Model` (``loss``, ``make_args``, ``argnums``, ``dtype``, ``label``);
* ``ZOO_MODELS``: name -> ``(loss, make_args)``, the shape of ``tests/zoo.py``'s ``ZOO``.

They are not merged into ``zoo.ZOO``: several are bf16 by design and the
suites over ``ZOO`` compare at float32 tolerances;
``tests/partition/test_zoo_budgets.py`` tests them with dtype-aware tolerances.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

_NAME = "_jaxaot_benchmark_models"
_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "models.py"


def _load() -> ModuleType:
    """Import ``benchmarks/models.py`` once, as ``_jaxaot_benchmark_models``."""
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    spec = importlib.util.spec_from_file_location(_NAME, _PATH)
    assert spec is not None and spec.loader is not None, _PATH
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


models = _load()
Model = models.Model

#: name -> Model, tiny shapes (a few thousand parameters; float32 except the bf16 GPT-2 blocks).
MODELS: dict[str, Any] = models.zoo("tiny")

#: name -> (loss, make_args), as in ``zoo.ZOO``.
ZOO_MODELS: dict[str, tuple[Callable, Callable]] = {name: (m.loss, m.make_args) for name, m in MODELS.items()}
