"""The one place where jaxaot touches JAX internals.

Every use of ``jax._src``, ``jax.extend`` or ``jax.interpreters`` lives in this
package, so a JAX upgrade (0.10 -> 0.11 merged ``Jaxpr`` and ``ClosedJaxpr``, for
instance) is a change here alone. The rest of jaxaot imports it as ``C`` and talks
to jaxprs only through the small functions it re-exports, one module per concern:

* :mod:`.core`: jaxprs, eqns, compiled executables, tracers, dtypes, policies;
* :mod:`.loop_support`: what the while-loop primitives need (rules, lowerings);
* :mod:`.recording`: the trace compiled autograd records eager operations with;
* :mod:`.stablehlo`: exported programs read op by op, and this process's platforms.

Each module lists in ``__all__`` the names the rest of jaxaot uses, and this
package re-exports exactly those (``tests/test_architecture.py`` checks that
every ``C.<name>`` used outside this package is one of them).
"""

from jaxaot._src.compat import core, loop_support, recording, stablehlo
from jaxaot._src.compat.core import *  # noqa: F401,F403
from jaxaot._src.compat.loop_support import *  # noqa: F401,F403
from jaxaot._src.compat.recording import *  # noqa: F401,F403
from jaxaot._src.compat.stablehlo import *  # noqa: F401,F403

__all__ = sorted({*core.__all__, *loop_support.__all__, *recording.__all__, *stablehlo.__all__})
