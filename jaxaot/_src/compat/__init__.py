"""The one place where jaxaot touches JAX internals.

Every use of ``jax._src``, ``jax.extend`` or ``jax.interpreters`` lives in this
package, so a JAX upgrade is a change here alone. The rest of jaxaot imports it
as ``C`` and uses only the names it re-exports, one module per concern (jaxprs and
executables, custom rules, loop primitives' support, the recording trace, StableHLO reading, symbolic dims);
``tests/test_architecture.py`` checks that every name used is in ``__all__``.
"""

from jaxaot._src.compat import (binding, call_sites, core, custom_rules, forward_mode, loop_support, manual_axes,
                                recording, stablehlo, symbolic_dims, tracebacks)
from jaxaot._src.compat.binding import *  # noqa: F401,F403
from jaxaot._src.compat.call_sites import *  # noqa: F401,F403
from jaxaot._src.compat.core import *  # noqa: F401,F403
from jaxaot._src.compat.custom_rules import *  # noqa: F401,F403
from jaxaot._src.compat.forward_mode import *  # noqa: F401,F403
from jaxaot._src.compat.loop_support import *  # noqa: F401,F403
from jaxaot._src.compat.manual_axes import *  # noqa: F401,F403
from jaxaot._src.compat.recording import *  # noqa: F401,F403
from jaxaot._src.compat.stablehlo import *  # noqa: F401,F403
from jaxaot._src.compat.symbolic_dims import *  # noqa: F401,F403
from jaxaot._src.compat.tracebacks import *  # noqa: F401,F403

__all__ = sorted({*binding.__all__, *call_sites.__all__, *core.__all__, *custom_rules.__all__, *forward_mode.__all__,
                  *loop_support.__all__, *manual_axes.__all__, *recording.__all__, *stablehlo.__all__,
                  *symbolic_dims.__all__, *tracebacks.__all__})
