"""The B/W split of a stage's backward, for zero-bubble pipeline schedules.

Modules:

* ``bw_split``: :func:`split_backward` into an input-gradient program B and a weight-gradient
  program W (:class:`BWSplit`), by a cut of the min-cut's flow network
  (:mod:`jaxaot._src.partition.mincut.flow_graph`).
"""

from jaxaot._src.partition.bw.bw_split import BWSplit, split_backward

__all__ = ["BWSplit", "split_backward"]
