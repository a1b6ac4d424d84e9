"""Differential fuzzing: random JAX programs through jaxaot must match ``jax.value_and_grad``.

Programs and the comparison live in ``fuzzlib.py``. CI runs a fixed seed and a
small example count (two shards, about a minute each on a 2-core CPU): every
example goes through every path (``jaxaot.value_and_grad``, ``jax.value_and_grad``
of the function, ``jit``, ``vmap``, ``.forward``/``.backward``, export then load),
each under a partitioner drawn for it (default, min-cut at budgets 1, 0.5, 0).
The fixed programs below run every path under every partitioner.

The long run (about an hour on 2 cores), every path under every partitioner,
with a fresh random seed::

    JAXAOT_FUZZ_EXAMPLES=150 JAXAOT_FUZZ_SEED=random JAXAOT_FUZZ_FULL=1 \\
        python -m pytest -p no:cacheprovider -n 2 tests/reliability/test_fuzz.py

Every failure it finds becomes a named test at the bottom of this file
(hypothesis prints the ``Program``; paste it into :func:`check_program`).
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from reliability.fuzzlib import PARTITIONERS, Op, Program, check_program, paths_for, programs

EXAMPLES = int(os.environ.get("JAXAOT_FUZZ_EXAMPLES", "4"))
_SEED_ENV = os.environ.get("JAXAOT_FUZZ_SEED", "19")
SEED = random.randrange(2**32) if _SEED_ENV == "random" else int(_SEED_ENV)
FULL = os.environ.get("JAXAOT_FUZZ_FULL", "") not in ("", "0")

_SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _fuzz_one(prog: Program, data) -> None:
    if FULL:
        check_program(prog)
        return
    # CI: each path under a partitioner drawn for it (every pair is covered across examples).
    names = sorted(PARTITIONERS)
    check_program(prog, pairs=[(data.draw(st.sampled_from(names), label=path), path) for path in paths_for(prog)])


@pytest.mark.parametrize("shard", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_random_programs_match_jax(shard):
    @seed(SEED + shard)
    @_SETTINGS
    @given(prog=programs(max_ops=6), data=st.data())
    def run(prog, data):
        _fuzz_one(prog, data)

    print(f"fuzz seed {SEED + shard} ({EXAMPLES} examples, full={FULL})")
    run()


# ---------------------------------------------------------------- named regressions and fixed programs
@pytest.mark.slow
def test_every_op_in_one_program_every_path_every_partitioner():
    check_program(Program("float32", (
        Op("cond", (0, 0), "int"), Op("checkpoint", (1, 0), True), Op("custom_jvp", (2,)),
        Op("where_mask", (3, 1)), Op("einsum", (1, 2, 3)), Op("reduce", (4,), ("logsumexp", 1)),
        Op("int_scale", (5,)), Op("reshape_t", (6,)), Op("scan", (7,), True), Op("custom_vjp", (8, 2)),
        Op("softmax", (9,), 0), Op("where", (10, 3)), Op("bias", (11,)), Op("dot", (12,)),
    ), n=2, seed=1))


@pytest.mark.parametrize("mode,key", [pytest.param("max_steps", "typed", marks=pytest.mark.slow),
                                      pytest.param("checkpoints", "raw", marks=pytest.mark.slow), ("unbounded", "typed")])
def test_while_loop_modes_with_rng(mode, key):
    prog = Program("float32", (Op("while", (0, 0)), Op("dropout", (1,)), Op("noise", (2,))),
                   key=key, loop_mode=mode, n=3, seed=2)
    check_program(prog, pairs=[(p, path) for p, path in zip(["default", "min_cut_0", "min_cut_1", "min_cut_0.5"] * 2,
                                                            paths_for(prog))])


@pytest.mark.parametrize("dtype", [pytest.param("bfloat16", marks=pytest.mark.slow), "float16"])
def test_low_precision_dtypes(dtype):
    check_program(Program(dtype, (Op("dot", (0,)), Op("unary", (1,), "gelu"), Op("reduce", (2,), ("max", 0)),
                                  Op("binary", (3, 1), "safe_div"), Op("scan", (4,), False)), seed=3),
                  partitioners=("default", "min_cut_0.5"))
