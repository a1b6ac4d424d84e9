"""Stage 3, compile: turn each program into an executable, through the persistent cache.

``compilers`` holds the compilers (:class:`Compiler` is their protocol);
``cache`` holds the two hooks the runtime calls, :func:`cached_partition` and
:func:`cached_compile`, which go to disk when ``jaxaot.config.cache_dir`` is
set; :func:`stats` counts their hits and misses. ``step_choices`` keeps the
fused step's choices (variant, fused or split) beside the executables.
"""

from jaxaot._src.compile import compilers
from jaxaot._src.compile.cache import cached_compile, cached_partition, start_compile
from jaxaot._src.compile.code_reach import code_names
from jaxaot._src.compile.code_reach import is_library
from jaxaot._src.compile.cache_stats import CacheStats, reset_stats, stats
from jaxaot._src.compile.compilers import Compiler, as_function, nop, print_jaxpr, xla
from jaxaot._src.compile.step_choices import keeps_choices, recall_choice, remember_choice

__all__ = [
    "CacheStats", "Compiler", "as_function", "cached_compile", "cached_partition", "code_names", "compilers",
    "is_library", "keeps_choices", "nop",
    "print_jaxpr", "recall_choice", "remember_choice", "reset_stats", "start_compile", "stats", "xla",
]
