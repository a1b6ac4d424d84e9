"""Typed errors raised by jaxaot.

Each subclasses the builtin a JAX user would expect (``TypeError`` for a wrong
kind of value, ``ValueError`` for a wrong value), so ``except TypeError`` keeps
working, and :class:`JaxaotError` catches all of them.
"""

from __future__ import annotations


class JaxaotError(Exception):
    """Base class of every error jaxaot raises on purpose."""


class InvalidInputError(JaxaotError, TypeError):
    """A function argument, static argument or option is of the wrong kind."""


class InvalidOutputError(JaxaotError, TypeError):
    """The user function returned something that is not a pytree of arrays."""


class ResidualsMismatchError(JaxaotError, ValueError):
    """``backward`` got residuals produced for another input signature."""


class CotangentMismatchError(JaxaotError, ValueError):
    """``backward`` got cotangents whose structure, shape or dtype do not match."""


class NoDifferentiationRuleError(JaxaotError, NotImplementedError):
    """A primitive in the function has no differentiation rule."""


class PartitionError(JaxaotError, ValueError):
    """A partitioner produced, or was asked for, an impossible split."""
