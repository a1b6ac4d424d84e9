"""The route ``memory_budget`` takes from ``aot_function`` to the min-cut plan: at most 8 files, each left for good.

A profiler (``sys.setprofile``) records every call into jaxaot that takes the budget:
as an argument, as ``self``, or in a closure, in any of its forms (the value given,
the ``functools.partial`` holding it, the parsed :class:`MemoryBudget`, the
:class:`MinCutOptions`, its bytes or its fraction). A call from one file into another
is a hop; calls only run down the route (the files in the order the budget reaches
them): a hop back up, a callback into a file that handed the budget on, fails.
Building the function reads the budget once; the first gradient plans with it, and
touches no file the reading touched but the partitioner's own (where the options
made at ``aot_function`` are called).
"""

from __future__ import annotations

import functools
import sys
import types
from pathlib import Path

import jax
import pytest

import jaxaot
from jaxaot._src.partition import MemoryBudget, MinCutOptions
from jaxaot._src.partition.budget import fused_step, program_peak
from zoo import assert_trees_close, deep_mlp, deep_mlp_args

PACKAGE = Path(jaxaot.__file__).resolve().parent
MAX_FILES = 8


class BudgetCalls:
    """The calls into jaxaot taking ``value`` (in any of its forms), each as ``(file, caller's file, name)``;
    the caller is the nearest jaxaot frame below (None at the entry). Recording ends where ``until``
    (a function) returns."""

    def __init__(self, value, until=None):
        self.value, self.parsed = value, jaxaot.partition.parse_memory_budget(value)
        self.until = None if until is None else until.__code__
        self.calls: list[tuple[str, str | None, str]] = []
        self.done = False

    def holds(self, v, depth: int = 0) -> bool:
        if v is self.value or isinstance(v, (MemoryBudget, MinCutOptions)):
            return True
        if isinstance(v, functools.partial):
            return any(x is self.value for x in v.keywords.values())
        if type(v) is int and v == self.parsed.nbytes or type(v) is float and v == self.parsed.fraction:
            return True
        if isinstance(v, types.FunctionType) and v.__closure__ and depth < 2:
            return any(self.holds(_cell(c), depth + 1) for c in v.__closure__)
        return False

    def _profile(self, frame, event, arg) -> None:
        if event == "return" and frame.f_code is self.until:
            self.done = True
        if event != "call" or self.done or _file(frame) is None:
            return
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount] + code.co_freevars
        local = frame.f_locals
        if any(n in local and self.holds(local[n]) for n in names):
            caller = frame.f_back
            while caller is not None and _file(caller) is None:
                caller = caller.f_back
            self.calls.append((_file(frame), None if caller is None else _file(caller), code.co_name))

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


def _mlp():
    args = deep_mlp_args(layers=2, width=16, batch=256)
    joint = jaxaot.partition.trace_joint(deep_mlp, *args)
    top = jaxaot.partition.min_cut_rematerialization_partition(joint)
    return args, program_peak(fused_step(top, joint), joint.in_avals)


@pytest.mark.parametrize("kind", ["bytes", "fraction"])
def test_the_budget_runs_down_at_most_eight_files(kind):
    args, top_peak = _mlp()
    budget = f"{int(0.9 * top_peak)}B" if kind == "bytes" else 13 / 32
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget)
    with BudgetCalls(budget) as reading:
        f = jaxaot.aot_function(deep_mlp, partition_fn=pf)
    with BudgetCalls(budget, until=MinCutOptions.__call__) as planning:  # up to the plan
        grads = jax.grad(f)(*args)
    assert_trees_close(grads, jax.grad(deep_mlp)(*args))

    read, read_back = route(reading.calls)
    plan, plan_back = route(planning.calls)
    partitioner = MinCutOptions.__call__.__code__.co_filename[len(_SRC):]
    shown = f"reading {read}, planning {plan}"
    assert not read_back and not plan_back, f"{shown}: returns {read_back + plan_back}"
    assert sum(name == "parse_memory_budget" for _, _, name in reading.calls + planning.calls) == 1, shown
    assert set(read) & set(plan) <= {partitioner}, f"{shown}: planning goes back to {set(read) & set(plan)}"
    assert read[0] == "runtime/function.py" and "partition/budget/parse.py" in read, shown
    assert len(set(read) | set(plan)) <= MAX_FILES, shown
    if kind == "bytes":  # the search decided several plans, made by the min-cut
        assert plan[-1] == "partition/budget/search.py", shown
        resumed = sum(f == "partition/budget/search.py" and name == "peak_search" for f, _, name in planning.calls)
        assert resumed > 1, shown
    else:  # the fraction reaches the cut itself
        assert "partition/mincut/saved_values.py" in plan, shown


def test_a_callback_up_the_route_is_a_return():
    calls = [("a.py", None, "entry"), ("b.py", "a.py", "driver"), ("c.py", "b.py", "search"),
             ("c.py", "b.py", "search"), ("b.py", "c.py", "plan_at")]
    assert route(calls) == (["a.py", "b.py", "c.py"], ["c.py -> b.py (plan_at)"])
    assert route(calls[:4])[1] == []
