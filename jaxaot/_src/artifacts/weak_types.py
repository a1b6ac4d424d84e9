"""Weak types across an artifact: ``jax.export`` serializes none of them, the signature records them.

JAX's outputs and gradients of a Python-float argument are weakly typed, so their arithmetic with a
bfloat16 array stays bfloat16. A loaded program returns strong types: :class:`WeakTyping` types the
outputs as their recorded specs and the gradients by the rule :func:`weak_grad_rule` records at export,
read off the backward evaluated abstractly, as the runtime's ``WeakGrads`` does for each call.
:func:`weak_input_note` says why a call's argument cannot stand for one exported weakly typed.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from jaxaot._src import compat as C
from jaxaot._src.pytrees import is_weakly_typed


def weak_grad_rule(training: Any) -> tuple[tuple[int, ...] | None, ...]:
    """When JAX hands back each gradient (in ``grad_inputs`` order) of ``training``'s backward weakly typed.

    None: never (a strong input, or a backward that makes it strong whatever the cotangents); else the flat
    outputs whose cotangents must all be weak (``()``: always weak). Read off the backward evaluated with every
    cotangent weak, with none, and with each one alone strong: exact for one cotangent (a loss), and for more
    wherever weak types combine as ``a * b`` does (weak when both operands are).
    """
    part, rule = training.partition, training.weak_grads
    n = len(part.grad_inputs)
    if not rule.any:
        return (None,) * n
    cts = tuple(part.cotangent_outputs)

    def weak_for(pattern: tuple[bool, ...]) -> set[int]:
        return {k for k, _ in rule.casts(pattern)}

    weak, always = weak_for((True,) * len(cts)), weak_for((False,) * len(cts))
    needs: dict[int, list[int]] = {k: [] for k in weak - always}
    if needs:
        for j, out in enumerate(cts):
            alone_strong = weak_for(tuple(i != j for i in range(len(cts))))
            for k, need in needs.items():
                if k not in alone_strong:
                    need.append(out)
    return tuple(None if k not in weak else () if k in always else tuple(needs[k]) for k in range(n))


def retyped(x: Any, weak: bool) -> Any:
    """``x`` (an array or tracer), weakly typed or not as ``weak`` says."""
    if is_weakly_typed(x) == weak:
        return x
    if weak:
        return C.typed_as(x, jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=True))
    return jax.lax.convert_element_type(x, x.dtype)


def scalar_kind(dtype: str) -> str:
    """The Python scalar type JAX reads as weakly typed ``dtype``: ``"complex"``, ``"float"`` or ``"int"``."""
    d = jnp.dtype(dtype)
    if jnp.issubdtype(d, jnp.complexfloating):
        return "complex"
    return "float" if jnp.issubdtype(d, jnp.floating) else "int"


def weak_input_note(path: str, spec: Any, x: Any, dtype: str) -> str:
    """Why ``x`` (of ``dtype``) cannot stand for ``path``, an input exported weakly typed (from a Python
    scalar): "" when it can (weakly typed, of the spec's dtype).

    The program was traced with the weak type: JAX promotes a strongly typed array of the same dtype, or a
    Python scalar of another kind, differently (an int8 array times ``2`` stays int8, times ``2.0`` is float32;
    a bfloat16 array times ``2.0`` stays bfloat16, times a float32 array is float32).
    """
    kind = scalar_kind(spec.dtype)
    exported = f"{path} was exported for a Python {kind} (weakly typed {spec})"
    if dtype == spec.dtype:
        if is_weakly_typed(x):
            return ""
        return (f"{exported} and gets a strongly typed {dtype} array, which JAX promotes differently (a bfloat16 "
                f"array times a Python float stays bfloat16, times a float32 array becomes float32): the exported "
                f"program would not compute what the function computes for it. Pass a Python {kind}, or export "
                f"with a {dtype} array for this argument.")
    if type(x) in (int, float, complex) and scalar_kind(dtype) == kind:  # a Python scalar, as wide as x64 makes it
        return (f" {exported}, and a Python {kind} is {dtype} here: the artifact was exported with jax_enable_x64 "
                f"{'off' if jnp.dtype(dtype).itemsize > jnp.dtype(spec.dtype).itemsize else 'on'}. Call it with "
                "that setting, or export it again with this one.")
    if is_weakly_typed(x) and kind == "float" and scalar_kind(dtype) == "int":
        return (f" {exported}: pass a Python float (2.0, not 2). A Python int promotes differently from a Python "
                "float (an int8 array times 2 stays int8, times 2.0 becomes float32).")
    return f" {exported}: pass a Python {kind}, or export with a {dtype} array for this argument."


class WeakTyping:
    """How a loaded artifact types its outputs and gradients as JAX does (the module docstring).

    An artifact that records no ``weak_grads`` (written before the signature had them) keeps its programs'
    strong gradients.
    """

    def __init__(self, signature: Any):
        s = signature
        self.outputs = tuple(i for i, spec in enumerate(s.out_specs) if spec.weak_type)
        at = {out: j for j, out in enumerate(s.cotangent_outputs)}
        # per gradient of a weakly typed input: the positions among the cotangents that must be weak, or None
        self.grads = () if s.weak_grads is None else tuple(
            (k, None if need is None else tuple(at[o] for o in need))
            for k, (i, need) in enumerate(zip(s.grad_inputs, s.weak_grads)) if s.in_specs[i].weak_type)

    def outputs_typed(self, outs: list) -> list:
        """The function's outputs (the first ones of ``outs``), weakly typed where their specs are."""
        for i in self.outputs:
            outs[i] = retyped(outs[i], True)
        return outs

    def grads_typed(self, grads: list, cts: Sequence[Any]) -> list:
        """The backward's ``grads``, typed as JAX's for the cotangents ``cts`` (the backward's, in its order)."""
        if self.grads:
            weak = [is_weakly_typed(ct) for ct in cts]
            for k, need in self.grads:
                grads[k] = retyped(grads[k], need is not None and all(weak[j] for j in need))
        return grads
