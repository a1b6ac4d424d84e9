"""``while_loop`` you can differentiate in reverse mode: primitives, rules, public wrappers.

Modules, bottom up (each imports only those before it):

* :mod:`~jaxaot._src.loops.common`: the primitives, the ``Loop`` view of their
  parameters, shared helpers;
* :mod:`~jaxaot._src.loops.overflow`: the overflow check of bounded stacks (an error or NaN, never silent);
* :mod:`~jaxaot._src.loops.capacity`: how many rows a reverse-mode stack gets, and
  ``dynamic_capacity``;
* :mod:`~jaxaot._src.loops.lowering`: the impl and lowering (blocked on GPUs);
* :mod:`~jaxaot._src.loops.revolve`: the binomial checkpointing schedule;
* :mod:`~jaxaot._src.loops.placement`: a bounded loop's placement and split points, made at trace time;
* :mod:`~jaxaot._src.loops.offline`: ``max_steps`` with ``checkpoints`` as nested scans (GPUs), and
  which schedule a bounded loop runs;
* :mod:`~jaxaot._src.loops.api`: ``while_loop`` and ``while_loop_stack_output``;
* :mod:`~jaxaot._src.loops.segments`: ``max_steps`` stacks in segments on CPUs;
* :mod:`~jaxaot._src.loops.sweep`: the revolve backward as one loop;
* :mod:`~jaxaot._src.loops.checkpointed`: the reverse mode of ``checkpoints=k``;
* :mod:`~jaxaot._src.loops.partial_eval`: how reverse mode splits a loop;
* :mod:`~jaxaot._src.loops.rules`: every rule, registered in one block;
* :mod:`~jaxaot._src.loops.rewrite`: ``differentiable``, ``lax.while_loop`` in a traced program replaced by
  jaxaot's loop;
* :mod:`~jaxaot._src.loops.patch`: ``patch_while_loop``, the same rewrite as a context manager.

Importing this package registers the rules.
"""

from jaxaot._src.loops import rules  # noqa: F401  (registers the primitives' rules)
from jaxaot._src.loops.api import while_loop, while_loop_stack_output
from jaxaot._src.loops.capacity import dynamic_capacity
from jaxaot._src.loops.overflow import overflow_check_max_steps, reraise_overflow
from jaxaot._src.loops.patch import patch_while_loop
from jaxaot._src.loops.rewrite import differentiable

__all__ = [
    "differentiable", "dynamic_capacity", "overflow_check_max_steps", "patch_while_loop", "reraise_overflow",
    "while_loop", "while_loop_stack_output",
]
