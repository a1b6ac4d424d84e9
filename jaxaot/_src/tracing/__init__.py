"""Stage 1, trace: a user function to its primal jaxpr and its joint forward+backward jaxpr.

``primal``: :func:`trace_primal` (the flat primal program, with the user's
``decompositions`` inlined) and :func:`flatten_program`; ``joint``:
:class:`JointGraph` and :func:`build_joint` (forward and backward in one
jaxpr, built from the primal program for a differentiated mask),
:class:`JointRecipe` (those arguments, built on demand), and
:func:`trace_joint`, the same from a function and example arguments.
"""

from jaxaot._src.tracing.primal import Decompositions, flatten_program, trace_primal
from jaxaot._src.tracing.joint import (JointGraph, JointRecipe, build_joint, grad_avals, in_backward_scope,
                                      lacks_derivative, trace_joint)

__all__ = ["Decompositions", "JointGraph", "JointRecipe", "build_joint", "flatten_program", "grad_avals",
           "in_backward_scope", "lacks_derivative", "trace_joint", "trace_primal"]
