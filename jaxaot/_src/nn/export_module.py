"""``aot_export_module``: a Flax module as one jaxpr plus a :class:`GraphSignature`.

The exported program is functional, in PyTorch's calling convention: inputs are
parameters, state ("buffers") and user inputs; outputs are the mutated state, the
user outputs and, with ``trace_joint=True``, the loss's gradients. Positions are
named ``in{i}`` / ``out{j}``, parameters and buffers by their dotted paths.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from flax import nnx
    >>> class Net(nnx.Module):
    ...     def __init__(self):
    ...         self.lin = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    ...     def __call__(self, x):
    ...         return (self.lin(x) ** 2).mean()
    >>> jaxpr, sig = jaxaot.nn.aot_export_module(Net(), (jnp.ones((4, 3)),), trace_joint=True, output_loss_index=0)
    >>> sig.parameters, sig.backward_signature.gradients_to_parameters
    (('lin.bias', 'lin.kernel'), {'out1': 'lin.bias', 'out2': 'lin.kernel'})
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from flax import linen as nn

from jaxaot._src import compat as C
from jaxaot._src.pytrees import abstractify
from jaxaot.errors import InvalidInputError, LossOutputError
from jaxaot._src.nn.wrap_module import aot_module
from jaxaot._src.nn.module_call import ModuleCall
from jaxaot._src.nn.linen import AOTLinenModule
from jaxaot._src.nn.nnx import AOTModule
from jaxaot._src.tracing import flatten_program


@dataclasses.dataclass(frozen=True)
class BackwardSignature:
    """The backward half of an exported joint program.

    Attributes:
      gradients_to_parameters: gradient output name -> parameter name.
      gradients_to_user_inputs: gradient output name -> user input name.
      loss_output: the name of the output that is the loss.
    """

    gradients_to_parameters: Mapping[str, str]
    gradients_to_user_inputs: Mapping[str, str]
    loss_output: str


@dataclasses.dataclass(frozen=True)
class GraphSignature:
    """What each input and output of an exported program is.

    Attributes:
      parameters / buffers: dotted names of the parameters / state, in input order.
      user_inputs / user_outputs: names of the inputs / outputs that are the user's.
      inputs_to_parameters / inputs_to_buffers: input name -> parameter / buffer name.
      buffers_to_mutate: output name -> the buffer it is the new value of.
      backward_signature: a :class:`BackwardSignature` for joint programs, else None.
      input_names / output_names: the name of every input / output, in order.
      in_spec / out_spec: pytree structures of the user inputs (``(args, kwargs)``;
        linen: ``(rngs, (args, kwargs))``) and of the user outputs.
    """

    parameters: tuple[str, ...]
    buffers: tuple[str, ...]
    user_inputs: tuple[str, ...]
    user_outputs: tuple[str, ...]
    inputs_to_parameters: Mapping[str, str]
    inputs_to_buffers: Mapping[str, str]
    buffers_to_mutate: Mapping[str, str]
    backward_signature: BackwardSignature | None
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    in_spec: Any
    out_spec: Any


# --------------------------------------------------------------------------- tracing
class _Traced:
    """A module call as a flat function of its program inputs, and what tracing it revealed.

    ``forward(*leaves)`` returns the mutated state's new values, then the user
    outputs; tracing it records their names and the user output structure.
    """

    def __init__(self, call: ModuleCall):
        self.call = call
        self.leaves, self.in_tree = jax.tree.flatten(call.dynamic)
        names = call.input_names()
        self.param_names = [n for n, kind in names if kind == "parameter"]
        self.state_names = [n for n, kind in names if kind == "state"]
        self.n_params = len(self.param_names)
        self.n_state = len(self.state_names)
        self.in_spec = jax.tree.structure(call.user_inputs)
        self.mutated_names: list[str] = []
        self.out_tree: Any = None

    def forward(self, *flat: Any) -> list:
        dyn, kw = jax.tree.unflatten(self.in_tree, flat)
        out, delta = self.call.pure(*dyn, **kw)
        out_leaves, self.out_tree = jax.tree.flatten(out)
        if delta is None:
            return out_leaves
        changed = delta.changed_leaves(flat)
        self.mutated_names = [name for name, _ in changed]
        return [x for _, x in changed] + out_leaves


def _is_constant(tree: Any) -> bool:
    # An export traces once, so a top-level argument without arrays
    # (``train=True``, a string, None) is simply a constant of the program.
    return not any(isinstance(x, (jax.Array, np.ndarray, np.generic)) for x in jax.tree.leaves(tree))


def _prepare(module: Any, args: tuple, kwargs: dict, variables: Any, rngs: Any, mutable: Any, method: Any
             ) -> ModuleCall:
    nums = tuple(i for i, a in enumerate(args) if _is_constant(a))
    names = tuple(k for k, v in kwargs.items() if _is_constant(v))
    if not isinstance(module, nn.Module):
        wrapper = aot_module(module, method=method or "__call__", static_argnums=nums, static_argnames=names)
        return wrapper.prepare_call(args, kwargs, freeze=False)
    if variables is None:
        raise InvalidInputError("exporting a linen module needs its variables: pass variables={...}.")
    if mutable is None:
        mutable = tuple(k for k in variables if k != "params") or False
    wrapper = aot_module(module, static_argnums=nums, static_argnames=names)
    return wrapper.prepare_call(variables, args, kwargs, rngs=rngs, method=method, mutable=mutable, freeze=False)


# --------------------------------------------------------------------------- checks
def _param_dependent(closed: Any, positions: Sequence[int]) -> list[bool]:
    """Per output, whether it depends differentiably on the inputs at ``positions``.

    Dependence flows through every eqn except ``stop_gradient``, and only into
    inexact values (an integer carries no derivative), like PyTorch's
    ``requires_grad``. Calls and control flow count as a whole: conservative.
    """
    jaxpr = C.jaxpr_of(closed)
    dep = {jaxpr.invars[i] for i in positions}
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "stop_gradient":
            continue
        if any(not C.is_literal(v) and v in dep for v in eqn.invars):
            dep.update(v for v in eqn.outvars if C.is_inexact(v.aval.dtype))
    return [not C.is_literal(v) and v in dep for v in jaxpr.outvars]


def _check_loss(index: int | None, out_avals: Sequence[Any], requires_grad: Sequence[bool]) -> None:
    """PyTorch's checks on the loss output of a joint export, with its messages."""
    if index is None:
        raise LossOutputError(
            "If trace_joint=True it is required that one of your forward outputs must be a scalar loss.\n"
            "You must specify the which (index) output is the loss with output_loss_index."
        )
    if not isinstance(index, (int, np.integer)) or not 0 <= index < len(out_avals):
        raise LossOutputError(f"output_loss_index {index!r} is out of range: the forward has {len(out_avals)} outputs.")
    for i, rg in enumerate(requires_grad):
        if rg and i != index:
            raise LossOutputError(
                "Found an output of the forward that requires gradients, that was not the scalar loss.\n"
                "We require all outputs to the forward that are not the scalar loss to not require gradient,\n"
                "because we will only compute a backward graph against the scalar loss.\n"
                "You can fix this by calling jax.lax.stop_gradient on each of your forward outputs that is "
                "not the loss.\n"
                f"You specified that output index {index} is the loss, but we found that\n"
                f"the output at index {i} requires gradients."
            )
    if not requires_grad[index]:
        raise LossOutputError(
            f"The output at index {index} was marked as the loss, but it does not require gradients"
        )
    shape = tuple(out_avals[index].shape)
    if int(np.prod(shape, dtype=np.int64)) != 1:
        raise LossOutputError(
            f"We require the output marked as the loss (at index {index}) to be a scalar, but it has shape {shape}"
        )


# --------------------------------------------------------------------------- export
def aot_export_module(
    module: Any,
    args: Sequence[Any],
    *,
    trace_joint: bool,
    output_loss_index: int | None = None,
    kwargs: Mapping[str, Any] | None = None,
    grad_user_inputs: bool = False,
    decompositions: Mapping[Any, Callable] | None = None,
    variables: Mapping[str, Any] | None = None,
    rngs: Any = None,
    mutable: Any = None,
    method: Any = None,
) -> tuple[Any, GraphSignature]:
    """Export ``module(*args, **kwargs)`` as one closed jaxpr and its :class:`GraphSignature`.

    Args:
      module: an ``nnx.Module`` (its state is read, not changed), an
        :class:`AOTModule`, or a linen module (then pass ``variables``).
      args: the positional arguments (a tuple). Top-level arguments that are not
        arrays (``train=True``) are constants of the exported program.
      trace_joint: export the joint forward+backward program of the loss.
      output_loss_index: with ``trace_joint``, which flat user output is the loss.
      kwargs: keyword arguments of the call.
      grad_user_inputs: with ``trace_joint``, also differentiate inexact user inputs.
      decompositions: ``{primitive: fn}`` applied while tracing, as in ``aot_function``.
      variables, rngs, mutable: linen only, as in ``module.apply``; ``mutable``
        defaults to every collection but ``"params"``.
      method: the method to call (nnx: a name or ``fn(module, *args)``; linen: as in ``apply``).

    Returns:
      ``(closed_jaxpr, signature)``.

    Raises:
      LossOutputError: with ``trace_joint=True``, ``output_loss_index`` is missing or
        out of range, the loss is not a scalar or does not depend on the
        parameters, or another output depends on them (PyTorch's messages).
      InvalidInputError: ``module`` is not a Flax module, or a linen module comes
        without ``variables``.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> from flax import nnx
        >>> bn = nnx.BatchNorm(3, rngs=nnx.Rngs(0))
        >>> jaxpr, sig = jaxaot.nn.aot_export_module(bn, (jnp.ones((2, 3)),), trace_joint=False)
        >>> sig.buffers_to_mutate, sig.user_outputs
        ({'out0': 'mean', 'out1': 'var'}, ('out2',))
    """
    if isinstance(module, (AOTModule, AOTLinenModule)):
        module = module.wrapped
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    traced = _Traced(_prepare(module, args, dict(kwargs or {}), variables, rngs, mutable, method))
    avals = [abstractify(x) for x in traced.leaves]
    forward = flatten_program(jax.make_jaxpr(traced.forward)(*avals), avals, decompositions)
    out_avals = [v.aval for v in C.jaxpr_of(forward).outvars]
    n_mut = len(traced.mutated_names)
    n_user_out = len(out_avals) - n_mut
    diff = _differentiated(traced, avals, grad_user_inputs)
    if not trace_joint:
        return forward, _signature(traced, n_mut, n_user_out, diff, None)
    requires_grad = _param_dependent(forward, diff)[n_mut:]
    _check_loss(output_loss_index, out_avals[n_mut:], requires_grad)
    joint = _joint(traced.forward, avals, diff, n_mut + int(output_loss_index), decompositions)
    return joint, _signature(traced, n_mut, n_user_out, diff, int(output_loss_index))


def _differentiated(traced: _Traced, avals: Sequence[Any], grad_user_inputs: bool) -> list[int]:
    first_user = traced.n_params + traced.n_state
    idx = [i for i in range(traced.n_params) if C.is_inexact(avals[i].dtype)]
    if grad_user_inputs:
        idx += [i for i in range(first_user, len(avals)) if C.is_inexact(avals[i].dtype)]
    return idx


def _joint(forward: Callable[..., list], avals: Sequence[Any], diff: Sequence[int], loss_at: int,
           decompositions: Mapping[Any, Callable] | None) -> Any:
    """``(inputs...) -> (forward outputs..., grads of the loss w.r.t. inputs[diff]...)``."""

    def joint(*flat: Any) -> list:
        def loss_fn(*diff_vals: Any):
            full = list(flat)
            for i, v in zip(diff, diff_vals):
                full[i] = v
            outs = forward(*full)
            return outs[loss_at].reshape(()), outs

        grads, outs = jax.grad(loss_fn, argnums=tuple(range(len(diff))), has_aux=True)(*[flat[i] for i in diff])
        return [*outs, *grads]

    return flatten_program(jax.make_jaxpr(joint)(*avals), avals, decompositions)


def _signature(traced: _Traced, n_mut: int, n_user_out: int, diff: Sequence[int], loss_index: int | None
               ) -> GraphSignature:
    n_p, n_s = traced.n_params, traced.n_state
    n_in = len(traced.leaves)
    in_names = tuple(f"in{i}" for i in range(n_in))
    n_out = n_mut + n_user_out + (len(diff) if loss_index is not None else 0)
    out_names = tuple(f"out{j}" for j in range(n_out))
    user_outputs = out_names[n_mut: n_mut + n_user_out]
    backward = None
    if loss_index is not None:
        grad_names = out_names[n_mut + n_user_out:]
        backward = BackwardSignature(
            gradients_to_parameters={g: traced.param_names[i] for g, i in zip(grad_names, diff) if i < n_p},
            gradients_to_user_inputs={g: in_names[i] for g, i in zip(grad_names, diff) if i >= n_p},
            loss_output=user_outputs[loss_index],
        )
    return GraphSignature(
        parameters=tuple(traced.param_names),
        buffers=tuple(traced.state_names),
        user_inputs=in_names[n_p + n_s:],
        user_outputs=user_outputs,
        inputs_to_parameters=dict(zip(in_names[:n_p], traced.param_names)),
        inputs_to_buffers=dict(zip(in_names[n_p: n_p + n_s], traced.state_names)),
        buffers_to_mutate=dict(zip(out_names[:n_mut], traced.mutated_names)),
        backward_signature=backward,
        input_names=in_names,
        output_names=out_names,
        in_spec=traced.in_spec,
        out_spec=traced.out_tree,
    )
