"""Compiled autograd's process-wide cache of step executables: what it compiled, hit and replayed (:func:`stats`),
and :func:`reset` (``docs/concepts/compiled_autograd.md``); the functions themselves are
:func:`jaxaot.compiled_value_and_grad` and :func:`jaxaot.compiled_grad`."""

from jaxaot._src.autograd import Stats as Stats, reset as reset, stats as stats

__all__ = ["Stats", "reset", "stats"]
