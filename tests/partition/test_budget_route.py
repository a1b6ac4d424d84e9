"""The route ``memory_budget`` takes from ``aot_function`` to the min-cut plan: at most 8 files, each left for good.

A profiler (``sys.setprofile``) records every call into jaxaot that takes the budget:
as an argument, as ``self``, or in a closure, in any of its forms (the value given,
the ``functools.partial`` holding it, the parsed :class:`MemoryBudget`, the
:class:`MinCutOptions`, its bytes or its fraction). A call from one file into another
is a hop; calls only run down the route (the files in the order the budget reaches
them): a hop back up, a callback into a file that handed the budget on, fails.
Under a byte budget the search carries it on as the fractions it asks plans at; the
calls taking those fractions run down the route too. Building the function reads the
budget once; the first gradient plans with it, and touches no file the reading touched
but the partitioner's own (where the options made at ``aot_function`` are called).
A scanned step plans each scan body under the budget, on the same one-way route.
"""

from __future__ import annotations

import functools
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot._src.partition import DeviceModel, MemoryBudget, MinCutOptions
from jaxaot._src.partition.budget import fused_step, peak_search, program_peak
from zoo import assert_trees_close, deep_mlp, deep_mlp_args, scanned_mlp

#: Host memory whose copies hide behind compute, so scan bodies are planned offloading on the CPU too.
HOST = DeviceModel(host_bandwidth=2e10, device_flops=1e11, device_bandwidth=1e11)

PACKAGE = Path(jaxaot.__file__).resolve().parent
MAX_FILES = 8


class BudgetCalls:
    """The calls into jaxaot taking ``value`` (in any of its forms), each as ``(file, caller's file, name)``
    (``calls``); the caller is the nearest jaxaot frame below (None at the entry). ``carried``: those and the
    calls taking a fraction the byte-budget search asked a plan at (``asked``), in the order made. Recording
    ends where ``until`` (a function) returns."""

    def __init__(self, value, until=None):
        self.value, self.parsed = value, jaxaot.partition.parse_memory_budget(value)
        self.until = None if until is None else until.__code__
        self.calls: list[tuple[str, str | None, str]] = []
        self.carried: list[tuple[str, str | None, str]] = []
        self.asked: list[float] = []  # the very objects the search yielded: held, so no other float shares an id
        self.done = False

    def holds(self, v, depth: int = 0, asked: bool = False) -> bool:
        """Whether ``v`` is the budget in one of its forms (with ``asked``: or a fraction the search asked for)."""
        if v is self.value or isinstance(v, (MemoryBudget, MinCutOptions)):
            return True
        if asked and any(v is f for f in self.asked):
            return True
        if isinstance(v, functools.partial):
            return any(self.holds(x, 2, asked) for x in v.keywords.values())
        if type(v) is int and v == self.parsed.nbytes or type(v) is float and v == self.parsed.fraction:
            return True
        if isinstance(v, types.FunctionType) and v.__closure__ and depth < 2:
            return any(self.holds(_cell(c), depth + 1, asked) for c in v.__closure__)
        return False

    def _profile(self, frame, event, arg) -> None:
        if event == "return" and frame.f_code is self.until:
            self.done = True
        if event == "return" and frame.f_code is _SEARCH and isinstance(arg, tuple) and not self.done:
            self.asked.append(arg[0])  # the search yielded a request (fraction, family)
        if event != "call" or self.done or _file(frame) is None:
            return
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount] + code.co_freevars
        held = [frame.f_locals[n] for n in names if n in frame.f_locals]
        budget = any(self.holds(v) for v in held)
        if budget or any(self.holds(v, asked=True) for v in held):
            caller = frame.f_back
            while caller is not None and _file(caller) is None:
                caller = caller.f_back
            call = (_file(frame), None if caller is None else _file(caller), code.co_name)
            self.carried.append(call)
            if budget:
                self.calls.append(call)

    def __enter__(self) -> BudgetCalls:
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)


def _cell(c):
    try:
        return c.cell_contents
    except ValueError:  # an empty cell
        return None


_SRC = str(PACKAGE / "_src") + "/"
_SEARCH = peak_search.__code__


def _file(frame) -> str | None:
    """The frame's file under the package (``runtime/function.py``), None outside it."""
    name = frame.f_code.co_filename
    return name[len(_SRC):] if name.startswith(_SRC) else None


def route(calls: list[tuple[str, str | None, str]]) -> tuple[list[str], list[str]]:
    """The files in the order the budget reaches them, and the hops back up the route (``caller -> file``).

    A call within a file continues there; a call into a new file extends the route; a call into a
    file already on it is a return unless it comes from a file above it (a driver calling its
    helpers again, in a loop)."""
    files: list[str] = []
    back = []
    for file, caller, name in calls:
        if file == caller:
            continue
        if file not in files:
            files.append(file)
        elif caller not in files or files.index(caller) > files.index(file):
            back.append(f"{caller} -> {file} ({name})")
    return files, back


def _byte_budget(f, args) -> str:
    """A byte budget the search must work for: halfway between the compiled peaks of the fraction 0 and
    fraction 1 plans (on a GPU temporaries hold most of a small step's peak, so a fixed share of the
    top's peak may lie below every plan)."""
    joint = jaxaot.partition.trace_joint(f, *args)
    top, bottom = (program_peak(fused_step(jaxaot.partition.min_cut_rematerialization_partition(
        joint, memory_budget=b), joint), joint.in_avals) for b in (1.0, 0.0))
    assert top > bottom, (top, bottom)
    return f"{(top + bottom) // 2}B"


def _trace(f, args, budget, **options) -> tuple[BudgetCalls, BudgetCalls]:
    """The budget's calls building ``f``'s function with the min-cut at ``budget``, and planning its first
    gradient (checked against ``jax.grad``)."""
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget, **options)
    with BudgetCalls(budget) as reading:
        g = jaxaot.aot_function(f, partition_fn=pf)
    with BudgetCalls(budget, until=MinCutOptions.__call__) as planning:  # up to the plan
        grads = jax.grad(g)(*args)
    assert_trees_close(grads, jax.grad(f)(*args))
    return reading, planning


def _one_way(reading: BudgetCalls, planning: BudgetCalls) -> tuple[list[str], list[str], str]:
    """The files reading and planning reach, asserting the route's rules; and the route, shown."""
    read, read_back = route(reading.calls)
    plan, plan_back = route(planning.calls)
    carried, carried_back = route(planning.carried)
    partitioner = MinCutOptions.__call__.__code__.co_filename[len(_SRC):]
    shown = f"reading {read}, planning {plan}, with the plans asked for {carried}"
    returns = read_back + plan_back + carried_back
    assert not returns, f"{shown}: returns {returns}"
    assert sum(name == "parse_memory_budget" for _, _, name in reading.calls + planning.calls) == 1, shown
    assert set(read) & set(carried) <= {partitioner}, f"{shown}: planning goes back to {set(read) & set(carried)}"
    assert read[0] == "runtime/function.py" and "partition/budget/parse.py" in read, shown
    assert len(set(read) | set(plan)) <= MAX_FILES, shown
    assert "partition/mincut/saved_values.py" in carried, shown  # the cut itself plans under the budget
    if planning.parsed.nbytes is not None:  # the search decided several plans, made by the min-cut
        assert plan[-1] == "partition/budget/search.py" and len(planning.asked) > 1, shown
        resumed = sum(f == "partition/budget/search.py" and name == "peak_search" for f, _, name in planning.calls)
        assert resumed == 1 + len(planning.asked), shown  # started, then sent each plan it asked for
    return read, plan, shown


@pytest.mark.parametrize("kind", ["bytes", "fraction"])
def test_the_budget_runs_down_at_most_eight_files(kind):
    """On the CPU backend wherever the test runs: the route is the same code on every backend, but a byte
    budget the search must work for needs plans that peak apart, and XLA:GPU, recomputing an unscanned
    MLP's layers together, peaks the fraction 0 plan as high as the fraction 1 plan or higher."""
    with jax.default_device(jax.devices("cpu")[0]):
        args = deep_mlp_args(layers=2, width=64, batch=256)
        budget = _byte_budget(deep_mlp, args) if kind == "bytes" else 13 / 32
        _, plan, shown = _one_way(*_trace(deep_mlp, args, budget))
    if kind == "fraction":  # the fraction reaches the cut itself
        assert "partition/mincut/saved_values.py" in plan, shown


@pytest.mark.parametrize("kind,offload", [("bytes", False), ("fraction", False), ("fraction", True)])
def test_a_scanned_step_plans_its_bodies_on_the_way_down(kind, offload):
    """Each scan body is cut under the budget (offloading first, with ``offload``) as the planner asks for it;
    the budget is never handed to the scan rewrite to call back with."""
    ws, x = deep_mlp_args(layers=3, width=16, batch=256)
    args = (jnp.stack(ws), x)
    budget = _byte_budget(scanned_mlp, args) if kind == "bytes" else 13 / 32
    options = {"offload": True, "device_model": HOST} if offload else {}
    reading, planning = _trace(scanned_mlp, args, budget, **options)
    _, _, shown = _one_way(reading, planning)
    cut = "choose_body" if offload else "saved_values"  # the body's cut, in the partitioner
    bodies = [c for c in planning.carried if c[2] == cut]
    assert bodies and all(caller == file for file, caller, _ in bodies), f"{shown}: {bodies}"


def test_a_callback_up_the_route_is_a_return():
    calls = [("a.py", None, "entry"), ("b.py", "a.py", "driver"), ("c.py", "b.py", "search"),
             ("c.py", "b.py", "search"), ("b.py", "c.py", "plan_at")]
    assert route(calls) == (["a.py", "b.py", "c.py"], ["c.py -> b.py (plan_at)"])
    assert route(calls[:4])[1] == []
