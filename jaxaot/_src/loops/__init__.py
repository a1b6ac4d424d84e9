"""``while_loop`` you can differentiate in reverse mode: primitives, rules, public wrappers.

``lax.while_loop`` refuses reverse mode because its trip count is unknown when the
backward is built. This package adds loop primitives whose reverse mode stacks a
bounded number of iterations (``max_steps``), stores ``k`` snapshots and
recomputes (``checkpoints``), or both (an offline schedule), plus the rewrite that
puts them in place of ``lax.while_loop`` in other code (``differentiable``,
``patch_while_loop``). Each module imports only those below it; importing the
package registers the rules.
"""

from jaxaot._src.loops import rules  # noqa: F401  (registers the primitives' rules)
from jaxaot._src.loops.wrappers import while_loop, while_loop_stack_output
from jaxaot._src.loops.capacity import dynamic_capacity
from jaxaot._src.loops.overflow import (
    checked_values, overflow_check, overflow_check_max_steps, overflow_checked, overflow_mark, raise_overflow_since,
    reraise_overflow)
from jaxaot._src.loops.patch import note_remedy, patch_while_loop
from jaxaot._src.loops.rewrite import differentiable

__all__ = [
    "checked_values", "differentiable", "dynamic_capacity", "note_remedy", "overflow_check", "overflow_check_max_steps",
    "overflow_checked", "overflow_mark", "patch_while_loop", "raise_overflow_since", "reraise_overflow",
    "while_loop", "while_loop_stack_output",
]
