"""``jax.debug_nans`` / ``jax.debug_infs`` through jaxaot's executables.

Under these flags a compiled executable that produces a NaN (or Inf) raises
JAX's internal error, without saying where. ``jax.jit`` then re-runs its
function op by op; :class:`CheckedExecutable` does the same for jaxaot's
programs: it evaluates the program's jaxpr one eqn at a time (each op
dispatched and checked by JAX) and raises ``FloatingPointError`` naming the
user's source line of the first eqn that produced the value. The wrapper costs
one Python call per run, and a look at each donated argument of an executable that
donates: an array a call donated is JAX's ``RuntimeError``, as under ``jit``.
"""

from __future__ import annotations

import linecache
import re
from typing import Any, NoReturn, Sequence

from jaxaot._src import compat as C


class CheckedExecutable:
    """A compiled executable that names the source line of a NaN/Inf under ``jax.debug_nans``.

    Attribute access (``memory_analysis()``, ``cost_analysis()``, ...) goes to
    the wrapped executable. ``donated``: the positions of the arguments the executable donates; an array
    there already deleted (donated to an earlier call) is a ``RuntimeError``, as ``jax.jit``'s, before XLA
    refuses the buffer.
    """

    def __init__(self, executable: Any, program: Any, donated: Sequence[int] = ()):
        self.executable = executable
        self.program = program
        self.donated = tuple(donated)

    def __call__(self, *args: Any) -> Any:
        if self.donated:
            check_not_deleted(args, self.donated)
        try:
            return self.executable(*args)
        except C.InternalFloatingPointError:
            raise_op_by_op(self.program, args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.executable, name)


def check_not_deleted(args: Sequence[Any], positions: Sequence[int]) -> None:
    """Raise JAX's ``RuntimeError`` where an array of ``args`` at ``positions`` has been deleted (donated)."""
    for i in positions:
        x = args[i] if i < len(args) else None
        if isinstance(x, C.ArrayImpl) and x.is_deleted():
            raise RuntimeError(
                f"Array has been deleted with shape={x.aval.str_short()}. It was donated (donate_argnums) to an "
                "earlier call, which reused its buffer: pass a fresh array, as under jax.jit.")


def raise_op_by_op(closed: Any, args: Sequence[Any]) -> NoReturn:
    """Evaluate ``closed`` eqn by eqn on concrete ``args``; raise the first eqn's FloatingPointError."""
    jaxpr = C.jaxpr_of(closed)
    env = dict(zip(jaxpr.constvars, C.consts_of(closed)))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        invals = [v.val if C.is_literal(v) else env[v] for v in eqn.invars]
        try:
            outs = C.bind_eqn(eqn, invals)
        except (FloatingPointError, ZeroDivisionError) as err:
            raise FloatingPointError(f"{err}\n  in {eqn.primitive}, from {_source_text(eqn)}") from None
        env.update((v, x) for v, x in zip(eqn.outvars, outs) if not C.is_drop_var(v))
    raise FloatingPointError(
        "the compiled program produced a NaN/Inf that its op-by-op evaluation does not reproduce "
        "(XLA's fusion or precision differs): look at the program's outputs.")


def _source_text(eqn: Any) -> str:
    """``file:line (function)`` and the text of that line."""
    where = C.eqn_source(eqn)
    m = re.match(r"(.+?):(\d+)", where)
    code = linecache.getline(m.group(1), int(m.group(2))).strip() if m else ""
    return f"{where}: {code}" if code else where
