"""The fused step's compiles begun together on worker threads: the same choices and executables, compiled at once.

CPU stands in for an accelerator here (the layout and time choices' platform sets
include it, and a fake timer decides fused or split), so that the variants and the
split programs compile as they do on a GPU.
"""

from __future__ import annotations

import functools
import gc
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
import zoo
from jaxaot._src import workers
from jaxaot._src.compile import cache
from jaxaot._src.fusion import prefetch, variants
from zoo import assert_trees_close, kept_step

needs_two_cores = pytest.mark.skipif(workers.threads() < 2, reason="compiles overlap only with two or more cores")


def _key(seed):
    return jax.random.key(np.random.SeedSequence(seed).generate_state(1)[0])


@pytest.fixture
def worker_compiles(monkeypatch):
    """Every compile begun on a worker: its thread, a weak reference to its executable, and how many ran at once
    at most (``seen.most``). Until two have run at once, each waits a while for another to run beside it: begun
    in turn, none ever would."""
    seen, running, cond = Compiles(), [0], threading.Condition()
    real = cache.compile_lowered

    def recorded(lowered):
        entry = {"thread": threading.get_ident()}
        with cond:
            seen.append(entry)
            running[0] += 1
            seen.most = max(seen.most, running[0])
            cond.notify_all()
            cond.wait_for(lambda: seen.most >= 2, timeout=2.0)
        try:
            exe = real(lowered)
        finally:
            with cond:
                running[0] -= 1
        entry["exe"] = weakref.ref(exe)
        return exe

    monkeypatch.setattr(cache, "compile_lowered", recorded)
    return seen


class Compiles(list):
    most = 0


def _step(name="mlp_gelu", seed=0, **aot):
    fn, make_args = zoo.ZOO[name]
    args = make_args(_key(seed))
    loss = lambda *a: sum(jnp.sum(jnp.tanh(y)) for y in jax.tree.leaves(fn(*a)))  # noqa: E731
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.0)
    return jaxaot.aot_function(loss, partition_fn=pf, **aot), loss, args


def _run(f, args):
    argnums = tuple(range(len(args)))
    got = jaxaot.value_and_grad(f, argnums=argnums)(*args)
    programs = f.lookup(args, {}).programs
    return got, kept_step(f, args), list(programs.compiled), programs


@needs_two_cores
@pytest.mark.slow  # (about 17 s on two cores: the chain compiled twice; the tests below cover each part of it)
@pytest.mark.parametrize("layouts", ["measured", "auto"])
def test_compiles_begun_ahead_keep_the_same_choices_and_gradients(monkeypatch, accelerator, worker_compiles, layouts):
    if layouts == "auto":  # not the likely way, on which the later variants were begun: they are begun again
        monkeypatch.setattr(variants, "choose_layouts", lambda auto, pinned: "auto")
    f, loss, args = _step(seed=hash(layouts) % 997)
    ahead, choice, compiled, _ = _run(f, args)
    assert worker_compiles and all(c["thread"] != threading.get_ident() for c in worker_compiles)
    monkeypatch.setattr(prefetch, "ENABLED", False)
    n_ahead = len(worker_compiles)
    g, _, _ = _step(seed=hash(layouts) % 997)
    in_turn, choice_in_turn, compiled_in_turn, _ = _run(g, args)
    assert len(worker_compiles) == n_ahead  # switched off, nothing compiles on a worker
    assert choice == choice_in_turn
    assert compiled == compiled_in_turn  # the same programs compiled for the chain, in the same order
    assert_trees_close(ahead, in_turn, rtol=1e-6, atol=1e-7)
    argnums = tuple(range(len(args)))
    assert_trees_close(ahead, jax.value_and_grad(loss, argnums=argnums)(*args), rtol=1e-4, atol=1e-5)


@needs_two_cores
def test_the_compiles_overlap_and_none_begun_ahead_outlives_the_choice(monkeypatch, accelerator, worker_compiles):
    monkeypatch.setattr(variants, "choose_layouts", lambda auto, pinned: "auto")  # the later variants begun go unused
    f, loss, args = _step(seed=5)
    got, choice, _, programs = _run(f, args)
    assert worker_compiles.most >= 2 and choice.layouts == "auto"
    assert_trees_close(got, jax.value_and_grad(loss, argnums=tuple(range(len(args))))(*args), rtol=1e-4, atol=1e-5)
    gc.collect()
    live = [c["exe"]() for c in worker_compiles if c["exe"]() is not None]
    kept = [getattr(e, "executable", e) for e in programs.executables.values()]
    assert len(live) < len(worker_compiles)
    assert all(any(exe is k for k in kept) for exe in live)


def test_a_compiler_of_the_user_compiles_on_the_calling_thread(monkeypatch, accelerator, worker_compiles):
    threads = []

    def mine(closed, avals, *, donate_argnums=()):
        threads.append(threading.get_ident())
        return jaxaot.compilers.xla(closed, avals, donate_argnums=donate_argnums)

    f, loss, args = _step(seed=7, fw_compiler=mine, bw_compiler=mine)
    got, choice, compiled, _ = _run(f, args)
    assert not worker_compiles and threads and set(threads) == {threading.get_ident()}
    assert len(threads) == len(compiled)  # one call per program the chain compiled: none begun ahead
    argnums = tuple(range(len(args)))
    assert_trees_close(got, jax.value_and_grad(loss, argnums=argnums)(*args), rtol=1e-4, atol=1e-5)


@needs_two_cores
def test_programs_compiled_on_workers_keep_the_calling_thread_s_x64_and_matmul_precision(monkeypatch, accelerator,
                                                                                       worker_compiles):
    # the pinned variant, compiled on a worker, is the step kept (the step itself compiles on this thread)
    monkeypatch.setattr(variants, "choose_layouts", lambda auto, pinned: "pinned")
    with jax.enable_x64(True), jax.default_matmul_precision("highest"):
        f, loss, args = _step(seed=11)
        args = jax.tree.map(lambda x: x.astype(jnp.float64), args)
        got, choice, _, programs = _run(f, args)
        want = jax.value_and_grad(loss, argnums=tuple(range(len(args))))(*args)
    assert worker_compiles and all(c["thread"] != threading.get_ident() for c in worker_compiles)
    assert choice.layouts == "pinned"
    assert {x.dtype for x in jax.tree.leaves(got)} == {jnp.dtype(jnp.float64)}
    assert_trees_close(got, want, rtol=1e-10, atol=1e-12)
    text = programs.executables[choice.executable].as_text()
    assert "f64[" in text and "operand_precision={highest,highest}" in text


@needs_two_cores
def test_xla_s_refusal_on_a_worker_raises_for_its_program_and_passes_over_a_variant(monkeypatch, accelerator):
    programs, real_lower, real_compile = {}, cache.lower_xla, cache.compile_lowered

    def lower(closed, avals, **options):
        lowered = real_lower(closed, avals, **options)
        programs[id(lowered)] = closed
        return lowered

    def refusing(lowered):
        pinned = any("layout" in e.primitive.name for e in programs[id(lowered)].jaxpr.eqns)
        if refused == "all" or (refused == "pinned" and pinned):
            raise jax.errors.JaxRuntimeError("INVALID_ARGUMENT: refused here")
        return real_compile(lowered)

    monkeypatch.setattr(cache, "lower_xla", lower)
    monkeypatch.setattr(cache, "compile_lowered", refusing)
    refused = "all"  # every compile on a worker (the step itself compiles first, on this thread)
    f, loss, args = _step(seed=13)
    with pytest.raises(jaxaot.errors.XlaCompileError, match="'forward'"):  # the split pair the first call times
        _run(f, args)
    refused = "pinned"  # each variant with pinned layouts is refused: XLA's layouts are kept
    g, _, _ = _step(seed=13)
    got, choice, _, _ = _run(g, args)
    assert choice.layouts == "auto"
    assert_trees_close(got, jax.value_and_grad(loss, argnums=tuple(range(len(args))))(*args), rtol=1e-4, atol=1e-5)
