"""Pictures of the split: graphs, residual tables and memory-budget sweeps."""
from jaxaot.viz.drawing import *  # noqa: F401,F403
from jaxaot.viz.drawing import __all__  # noqa: F401
