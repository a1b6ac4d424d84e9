"""Per-iteration residuals of ``lax.scan`` chosen by the same min-cut.

To the partitioner a ``scan`` is one node, and JAX's scan saves everything its
linearization keeps, which would forfeit the min-cut on the bulk of a layer-stacked
model. So each top-level ``scan`` of the primal program gets its body cut on its own
and wrapped in ``jax.checkpoint`` with ``save_only_these_names`` (or, with values to
offload, ``save_and_offload_only_these_names``: :class:`BodyChoice`). Nested scans
are rewritten innermost first; bodies with effects are left alone.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxaot._src.partition.mincut import saved_values, scan_remat
    >>> def f(w, xs):
    ...     step = lambda h, x: (jnp.tanh(jnp.sin(h @ w) + x), None)
    ...     return jax.lax.scan(step, jnp.zeros(3), xs)[0]
    >>> primal = jax.make_jaxpr(f)(jnp.ones((3, 3)), jnp.ones((5, 3)))
    >>> new, plan = scan_remat.rewrite_primal_planned(primal, saved_values.choose_saved_values)
    >>> [e.primitive.name for e in new.jaxpr.eqns if e.primitive.name == "scan"]
    ['scan']
    >>> str(scan_remat.replay(primal, plan)) == str(new)  # the cache replays plans
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Generator, Sequence

import jax
from jax.ad_checkpoint import checkpoint_name

from jaxaot._src import compat as C
from jaxaot._src.partition.mincut.plan_memo import PlanMemo, memoized
from jaxaot._src.tracing import JointGraph, JointRecipe, build_joint

@dataclasses.dataclass(frozen=True)
class BodyChoice:
    """A chooser's answer for one scan body.

    Attributes:
      saved: what each iteration saves (vars of the body's joint graph, or names).
      offloaded: those of ``saved`` that go to host memory (``pinned_host``).
    """

    saved: tuple
    offloaded: tuple = ()


@dataclasses.dataclass(frozen=True)
class BodyRequest:
    """What :func:`plan_scans` asks its driver for one scan body: the min-cut of ``joint`` (the body's
    joint graph) saving only values ``saveable`` accepts, those ``free`` accepts at no cost: the body's
    consts and ``xs``, which JAX's scan forwards to its backward instead of stacking them again (saving one
    costs nothing the scan's inputs do not hold already; a carry saved is stacked). The answer is what a
    :data:`Chooser` returns."""

    joint: JointGraph
    saveable: Callable[[Any], bool]
    free: Callable[[Any], bool] = lambda v: False


#: ``choose(joint, saveable=..., free=...) -> saved vars | BodyChoice`` (the min-cut's chooser).
Chooser = Callable[..., Any]
#: :func:`plan_scans`: yields a :class:`BodyRequest` per scan body, is sent each one's answer (saved vars or a
#: :class:`BodyChoice`, or thrown the exception choosing raised), returns ``(rewritten program, plan)``.
ScanPlanning = Generator[BodyRequest, Any, tuple[Any, dict]]


def _as_choice(chosen: Any) -> BodyChoice:
    return chosen if isinstance(chosen, BodyChoice) else BodyChoice(tuple(chosen))


_TAG = "jaxaot_scan"


def _avals(vars_: Sequence[Any]) -> list:
    return [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=getattr(v.aval, "weak_type", False))
            for v in vars_]


def _nameable(v: Any) -> bool:
    # checkpoint_name needs a plain array; tokens and PRNG keys stay unnamed.
    dtype = getattr(v.aval, "dtype", None)
    return dtype is not None and not jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


def evaluate(closed: Any, args: Sequence[Any], names: dict | None = None, scans: dict | None = None) -> list:
    """Evaluate ``closed`` in the current trace.

    ``names`` maps vars to a ``checkpoint_name`` applied to their value;
    ``scans`` maps ``id(eqn)`` of scan eqns to a replacement body function.
    """
    jaxpr = C.jaxpr_of(closed)
    env: dict = dict(zip(jaxpr.constvars, C.consts_of(closed)))
    env.update(zip(jaxpr.invars, args))

    def read(v):
        return v.val if C.is_literal(v) else env[v]

    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        body = scans.get(id(eqn)) if scans else None
        outs = _run_scan(eqn, body, invals) if body is not None else C.bind_eqn(eqn, invals)
        for v, x in zip(eqn.outvars, outs):
            if C.is_drop_var(v):
                continue
            env[v] = checkpoint_name(x, names[v]) if names and v in names else x
    return [read(v) for v in jaxpr.outvars]


def _run_scan(eqn: Any, body: Callable, invals: list) -> list:
    """Re-run a scan eqn through ``lax.scan`` with a new body (``lax.scan`` hoists its consts)."""
    p = eqn.params
    nc, nk = C.scan_counts(p)
    consts, init, xs = invals[:nc], invals[nc : nc + nk], invals[nc + nk :]

    def step(carry, x):
        outs = body(*consts, *carry, *x)
        return list(outs[:nk]), list(outs[nk:])

    kwargs = {"_split_transpose": p["_split_transpose"]} if "_split_transpose" in p else {}
    with C.eqn_user_context(eqn):
        carry, ys = jax.lax.scan(step, list(init), list(xs), length=p["length"], reverse=p["reverse"],
                                 unroll=p["unroll"], **kwargs)
    return [*carry, *ys]


def _flat_tree(n: int) -> Any:
    return jax.tree_util.tree_structure(((0,) * n, {}))


def body_joint(body: Any, names: dict) -> JointGraph:
    """The joint graph of a scan body with ``names`` applied (inputs: consts, carry, xs)."""
    jaxpr = C.jaxpr_of(body)
    avals = _avals(jaxpr.invars)
    tagged = jax.make_jaxpr(lambda *a: evaluate(body, a, names))(*avals)
    return build_joint(tagged, _flat_tree(len(avals)), _flat_tree(len(jaxpr.outvars)), avals)


def _body_names(body: Any, names: dict, memo: PlanMemo | None, device_only: bool, free_at: frozenset
                ) -> Generator[BodyRequest, Any, BodyChoice | None]:
    """Which of ``names`` (var -> name) the min-cut saves and offloads per iteration (None: leave the scan
    alone), asked of the driver; ``device_only`` drops the offloaded ones (nested bodies: their stacks would
    live inside the outer body). ``free_at``: the positions of the body's inputs that cost nothing to save
    (:func:`_free_inputs`). ``memo`` keeps the body's joint graph for the next plan
    (:mod:`~jaxaot._src.partition.mincut.plan_memo`)."""
    joint = memoized(memo, "body_joint", body, frozenset(names.values()), lambda: body_joint(body, names))
    bj = C.jaxpr_of(joint.jaxpr)
    wanted = set(names.values())
    tag_of = {e.outvars[0]: e.params["name"] for e, bwd in zip(bj.eqns, joint.is_backward)
              if not bwd and e.primitive.name == "name" and e.params.get("name") in wanted}
    inputs = set(bj.invars[: joint.num_primals])
    free = {v for i, v in enumerate(bj.invars[: joint.num_primals]) if i in free_at}
    chosen = _as_choice((yield BodyRequest(joint, lambda v: v in tag_of or v in inputs, free.__contains__)))
    if device_only:
        chosen = BodyChoice(chosen.saved)
    if any(v not in tag_of and v not in inputs for v in chosen.saved):
        return None  # pragma: no cover - the min-cut saved a value it could not name
    return BodyChoice(frozenset(tag_of[v] for v in chosen.saved if v in tag_of),
                      frozenset(tag_of[v] for v in chosen.offloaded if v in tag_of))


def _body_tags(body: Any, path: str) -> dict:
    """A ``checkpoint_name`` per nameable value of ``body``, keyed by var.

    Names come from the scan's nesting path and the value's position, so the
    same program gets the same names in every process (the compile cache keys
    on the program text) and nested bodies never share a name.
    """
    return {v: f"{_TAG}{path}_{i}_{j}" for i, e in enumerate(C.jaxpr_of(body).eqns)
            for j, v in enumerate(e.outvars) if not C.is_drop_var(v) and _nameable(v)}


def _positions(body: Any) -> dict:
    """``var -> [eqn index, outvar index]`` in ``body``: names that survive a re-trace."""
    return {v: [i, j] for i, e in enumerate(C.jaxpr_of(body).eqns) for j, v in enumerate(e.outvars)}


def _checkpointed(body: Any, keep: dict, host: frozenset = frozenset()) -> Callable:
    """``body`` under ``jax.checkpoint``, saving the values ``keep`` names (those named in ``host`` offloaded)."""
    names = sorted(keep.values())
    if host:
        policy = jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[n for n in names if n not in host], names_which_can_be_offloaded=sorted(host),
            offload_src="device", offload_dst="pinned_host")
    else:
        policy = jax.checkpoint_policies.save_only_these_names(*names)
    return jax.checkpoint(lambda *a: evaluate(body, a, keep), policy=policy, prevent_cse=False)


def _free_inputs(eqn: Any, alive: frozenset) -> frozenset:
    """Positions of the scan ``eqn``'s body inputs whose saving costs no memory: its consts and ``xs`` whose
    operands are ``alive`` anyway. JAX's scan hands such residuals to its backward as they are (forwarded),
    where a saved carry, or a value the body computes, is stacked anew per iteration."""
    num_consts, num_carry = C.scan_counts(eqn.params)
    return frozenset(i for i, v in enumerate(eqn.invars) if not num_consts <= i < num_consts + num_carry
                     and not C.is_literal(v) and v in alive)


def _plan_scan(eqn: Any, path: str, memo: PlanMemo | None, device_only: bool, alive: frozenset
               ) -> Generator[BodyRequest, Any, tuple[Callable, dict] | None]:
    """The checkpointed body function to run ``eqn`` with and its replayable plan, or None.

    The plan (JSON-able) names the saved body values by position, so
    :func:`replay` can rebuild the same rewrite without running the min-cut.
    """
    body = eqn.params["jaxpr"]
    if C.jaxpr_of(body).effects or eqn.params["length"] == 0:
        return None
    free_at = _free_inputs(eqn, alive)
    invars = C.jaxpr_of(body).invars
    body, nested = yield from plan_scans(body, path, memo, device_only=True,  # innermost scans first
                                         alive=frozenset(invars[i] for i in free_at))
    tags = _body_tags(body, path)
    try:
        chosen = yield from _body_names(body, tags, memo, device_only, free_at)
    except Exception:  # noqa: BLE001 - a body we cannot analyse keeps JAX's own residuals
        return None
    if chosen is None:
        return None
    keep = {v: n for v, n in tags.items() if n in chosen.saved}
    host = frozenset(n for n in keep.values() if n in chosen.offloaded)
    pos = _positions(body)
    plan = {"saved": sorted(pos[v] for v in keep), "nested": nested}
    if host:
        plan["offloaded"] = sorted(pos[v] for v, n in keep.items() if n in host)
    return _checkpointed(body, keep, host), plan


def _scan_eqns(closed: Any) -> list:
    return [e for e in C.jaxpr_of(closed).eqns if e.primitive.name == "scan"]


def _retrace(closed: Any, bodies: dict) -> Any:
    jaxpr = C.jaxpr_of(closed)
    return jax.make_jaxpr(lambda *a: evaluate(closed, a, scans=bodies))(*_avals(jaxpr.invars))


def plan_scans(closed: Any, path: str = "", memo: PlanMemo | None = None, retrace: bool = True,
               device_only: bool = False, alive: frozenset | None = None) -> ScanPlanning:
    """Each top-level scan of ``closed`` with its body checkpointed to save the min-cut's choice, and the plan:
    ``{scan ordinal (str): plan}`` (empty: unchanged).

    A generator (:data:`ScanPlanning`): it asks its driver for each body's choice, innermost scans first, as
    a :class:`BodyRequest`, and is sent the answer; an exception choosing raised, thrown back in, leaves that
    scan to JAX's own residuals. The driver holds the budget; the rewrite never calls back into it.
    ``retrace=False`` returns ``closed`` itself with the plan, for a caller that only replays the plan
    (:func:`replay_joint`); ``memo`` keeps the bodies' joint graphs; ``device_only`` offloads nothing.
    ``alive``: the vars of ``closed`` in memory anyway (default: its inputs, the primal's).
    """
    bodies, plan = {}, {}
    alive = frozenset(C.jaxpr_of(closed).invars) if alive is None else alive
    for k, eqn in enumerate(_scan_eqns(closed)):
        planned = yield from _plan_scan(eqn, f"{path}.{k}", memo, device_only, alive)
        if planned is not None:
            bodies[id(eqn)], plan[str(k)] = planned
    if not bodies:
        return closed, {}
    return (_retrace(closed, bodies) if retrace else closed), plan


def rewrite_primal_planned(closed: Any, choose: Chooser, path: str = "", memo: PlanMemo | None = None,
                           retrace: bool = True) -> tuple[Any, dict]:
    """:func:`plan_scans` with each body's choice made by ``choose``: the rewritten program and its plan."""
    planning = plan_scans(closed, path, memo, retrace)
    try:
        request = next(planning)
        while True:
            try:
                chosen = choose(request.joint, saveable=request.saveable, free=request.free)
            except Exception as e:  # noqa: BLE001 - handed back: the planner leaves that scan alone
                request = planning.throw(e)
            else:
                request = planning.send(chosen)
    except StopIteration as done:
        return done.value


def rewrite_primal(closed: Any, choose: Chooser) -> Any:
    """``closed`` with each top-level scan's body checkpointed to save the min-cut's choice.

    Returns ``closed`` itself when there is nothing to rewrite.

    The min-cut partitioner drives :func:`plan_scans` itself, answering each body's request, and
    re-traces the joint graph, so no runtime hook is needed.
    """
    return rewrite_primal_planned(closed, choose)[0]


def replay(closed: Any, plan: dict, path: str = "") -> Any:
    """Apply a plan from :func:`plan_scans` again, without choosing anything.

    Tracing is deterministic, so the positions in the plan name the same body
    values; the persistent cache uses this to rebuild a min-cut partition.

    Example (``primal`` as in the module example):
        >>> new, plan = scan_remat.rewrite_primal_planned(primal, saved_values.choose_saved_values)  # doctest: +SKIP
        >>> str(scan_remat.replay(primal, plan)) == str(new)  # doctest: +SKIP
        True
    """
    if not plan:
        return closed
    bodies = {}
    for k, eqn in enumerate(_scan_eqns(closed)):
        record = plan.get(str(k))
        if record is None:
            continue
        body = replay(eqn.params["jaxpr"], record["nested"], f"{path}.{k}")
        at = {tuple(p): v for v, p in _positions(body).items()}
        tags = _body_tags(body, f"{path}.{k}")
        keep = {at[tuple(p)]: tags[at[tuple(p)]] for p in record["saved"]}
        host = frozenset(tags[at[tuple(p)]] for p in record.get("offloaded", ()))
        bodies[id(eqn)] = _checkpointed(body, keep, host)
    return _retrace(closed, bodies)


def replay_joint(joint: JointGraph | JointRecipe, plan: dict) -> JointGraph:
    """The joint graph of ``joint``'s primal with a scan-remat ``plan`` replayed.

    Tracing is deterministic, so replaying the plan gives the joint graph the
    min-cut split, without running the min-cut (the compile cache relies on it).
    A :class:`~jaxaot._src.tracing.JointRecipe` will do for ``joint``: the
    replay needs its primal program and options, never the joint graph itself.
    """
    recipe = joint if isinstance(joint, JointRecipe) else JointRecipe.of(joint)
    return recipe.rebuild(replay(recipe.primal, plan))  # same decompositions and runtime aux outputs
