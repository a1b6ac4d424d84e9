"""The plan-time allowance: holds beyond it wait, in order of asking, and nothing waits outside one."""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import pytest

from jaxaot._src import allowance
from jaxaot._src.partition.costs import autotune_bytes


def _hold_in_thread(nbytes, order, name, release):
    """A thread that holds ``nbytes`` until ``release`` is set, noting ``name`` in ``order`` once admitted."""
    def run():
        with allowance.holding(nbytes):
            order.append(name)
            release.wait(timeout=30)
    t = threading.Thread(target=run)
    t.start()
    return t


def _until(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_outside_an_allowance_nothing_waits():
    order, release = [], threading.Event()
    threads = [_hold_in_thread(10**12, order, k, release) for k in range(3)]
    _until(lambda: len(order) == 3)
    release.set()
    for t in threads:
        t.join()


def test_holds_beyond_the_allowance_wait_in_order_of_asking():
    order, first, second, third = [], threading.Event(), threading.Event(), threading.Event()
    with allowance.allowance(100):
        a = _hold_in_thread(60, order, "a", first)
        _until(lambda: order == ["a"])
        b = _hold_in_thread(60, order, "b", second)  # does not fit beside a
        _until(lambda: len(allowance._WAITING) == 1)
        c = _hold_in_thread(10, order, "c", third)  # would fit, but b asked first
        _until(lambda: len(allowance._WAITING) == 2)
        time.sleep(0.05)
        assert order == ["a"] and allowance.held() == 60
        first.set()
        _until(lambda: order == ["a", "b", "c"])  # b, then c beside it (70 <= 100)
        assert allowance.held() == 70
        second.set(), third.set()
        for t in (a, b, c):
            t.join()
    assert allowance.held() == 0


def test_a_hold_larger_than_the_allowance_runs_alone():
    order, release = [], threading.Event()
    with allowance.allowance(100):
        with allowance.holding(30):
            big = _hold_in_thread(500, order, "big", release)
            time.sleep(0.05)
            assert order == []  # waits for the 30 held here
        _until(lambda: order == ["big"])
        release.set()
        big.join()


def test_a_thread_holding_already_is_let_in_at_once():
    with allowance.allowance(100):
        with allowance.holding(80):
            with allowance.holding(80):  # its own work, one piece after another: no waiting for itself
                assert allowance.held() == 160


def test_the_smallest_allowance_open_applies():
    order, release = [], threading.Event()
    with allowance.allowance(1000):
        with allowance.allowance(100):
            with allowance.holding(60):
                t = _hold_in_thread(60, order, "t", release)
                time.sleep(0.05)
                assert order == []
            _until(lambda: order == ["t"])
        release.set()
        t.join()


def test_byte_limits_nest_to_the_smaller():
    with allowance.byte_limit(100):
        with allowance.byte_limit(None):
            assert allowance.current_limit() == 100
        with allowance.byte_limit(50):
            assert allowance.current_limit() == 50
        with allowance.byte_limit(500):
            assert allowance.current_limit() == 100
    assert allowance.current_limit() is None


@pytest.mark.parametrize("in_scan", [False, True])
def test_a_gpu_compile_holds_its_largest_matrix_product_s_autotuning(in_scan):
    x, w = jnp.ones((64, 128), jnp.float32), jnp.ones((128, 256), jnp.float32)
    if in_scan:
        closed = jax.make_jaxpr(lambda x, w: jax.lax.scan(lambda c, _: (jnp.tanh(c @ w) @ w.T, None), x, None,
                                                             length=3)[0])(x, w)
    else:
        closed = jax.make_jaxpr(lambda x, w: jnp.sin(x @ w).sum())(x, w)
    # operands, the result twice, each buffer with red zones
    want = 4 * (64 * 128 + 128 * 256 + 2 * 64 * 256) + 4 * autotune_bytes.REDZONE_BYTES
    assert autotune_bytes.compile_bytes(closed, "gpu") == want
    assert autotune_bytes.compile_bytes(closed, "cpu") == 0
