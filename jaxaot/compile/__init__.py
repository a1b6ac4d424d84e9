"""Stage 3, compile: turn each program into an executable, through the persistent cache.

``compilers`` holds the compilers (:class:`Compiler` is their protocol);
``cache`` holds the two hooks the runtime calls, :func:`cached_partition` and
:func:`cached_compile`, which go to disk when ``jaxaot.config.cache_dir`` is
set; :func:`stats` counts their hits and misses.
"""

from jaxaot.compile import compilers
from jaxaot.compile.cache import cached_compile, cached_partition
from jaxaot.compile.cache_stats import CacheStats, reset_stats, stats
from jaxaot.compile.compilers import Compiler, as_function

__all__ = [
    "CacheStats", "Compiler", "as_function", "cached_compile", "cached_partition", "compilers", "reset_stats", "stats",
]
