"""Stage 3: the compilers ``aot_function`` takes, and the statistics of their persistent cache."""

from jaxaot._src.compile import (
    CacheStats as CacheStats,
    Compiler as Compiler,
    as_function as as_function,
    nop as nop,
    print_jaxpr as print_jaxpr,
    reset_stats as reset_cache_stats,
    stats as cache_stats,
    xla as xla,
)

__all__ = [
    "Compiler", "xla", "nop", "print_jaxpr", "as_function", "CacheStats", "cache_stats", "reset_cache_stats",
]
