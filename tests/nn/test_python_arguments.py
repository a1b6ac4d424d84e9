"""Python values passed to an aot_module's call (a flag, a mode name, a count) are read as eager Flax reads them:
statics, traced again per value; numbers stay program inputs until the module's Python reads one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from flax import nnx

import jaxaot
from zoo import normal_at, trees_close
from jaxaot.errors import StaticArgumentError


def _x(seed: int, shape=(4, 3)):
    return normal_at(seed, shape)


def _state(module):
    return nnx.to_pure_dict(nnx.state(module))


@pytest.mark.parametrize("make, options", [
    (lambda: nnx.BatchNorm(3, rngs=nnx.Rngs(0)), [{"use_running_average": True}, {"use_running_average": False}]),
    (lambda: nnx.Dropout(0.5, rngs=nnx.Rngs(0)), [{"deterministic": True}, {"deterministic": False}]),
], ids=["batchnorm", "dropout"])
def test_a_bool_keyword_is_read_as_eager_flax_reads_it(make, options):
    plain, inner = make(), make()
    wrapped = jaxaot.nn.aot_module(inner)
    for seed, kwargs in enumerate(options * 2):
        x = _x(seed)
        assert trees_close(plain(x, **kwargs), wrapped(x, **kwargs))
        assert trees_close(_state(plain), _state(inner))
    assert wrapped.cache_info().misses == 2  # one program per flag value


class Repeat(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(3, 3, rngs=nnx.Rngs(0))

    def __call__(self, x, n, scale=1.0, act="relu"):
        for _ in range(n):
            x = getattr(nnx, act)(self.lin(x))
        return x * scale


def test_a_count_read_by_python_becomes_static():
    plain, wrapped = Repeat(), jaxaot.nn.aot_module(Repeat())
    for seed, (n, scale, act) in enumerate([(1, 2.0, "relu"), (2, 3.0, "relu"), (2, 3.0, "gelu"), (1, 2.0, "relu")]):
        x = _x(seed + 10)
        assert trees_close(plain(x, n, scale=scale, act=act), wrapped(x, n, scale=scale, act=act))
    assert wrapped.cache_info().misses == 3  # the last call reuses the first's program


class Scaled(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(3, 3, rngs=nnx.Rngs(0))

    def __call__(self, x, scale, *, mode="mul"):
        return self.lin(x) * scale if mode == "mul" else self.lin(x) + scale


def test_a_number_used_as_a_value_stays_an_input():
    plain, wrapped = Scaled(), jaxaot.nn.aot_module(Scaled())
    for seed, scale in enumerate((1.0, 2.5, -3.0)):
        x = _x(seed + 20)
        assert trees_close(plain(x, scale), wrapped(x, scale))
    assert wrapped.cache_info().misses == 1
    x = _x(23)
    assert trees_close(plain(x, 2.0, mode="add"), wrapped(x, 2.0, mode="add"))
    grads_e = nnx.grad(lambda m, x: jnp.sum(m(x, 2.0, mode="add") ** 2))(plain, x)
    grads_a = nnx.grad(lambda m, x: jnp.sum(m(x, 2.0, mode="add") ** 2))(wrapped, x)
    assert trees_close(nnx.to_pure_dict(grads_e), nnx.to_pure_dict(grads_a))


class LinenBlock(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool, n: int = 1):
        for _ in range(n):
            x = nn.Dense(3)(x)
        x = nn.BatchNorm(use_running_average=not train)(x)
        return nn.Dropout(0.5, deterministic=not train)(x)


@pytest.mark.parametrize("train, n", [(False, 2), (True, 2), (True, 1)])
def test_linen_apply_reads_python_arguments_as_flax(train, n):
    x = _x(30 + n)
    variables = LinenBlock().init(jax.random.key(0), x, False, n)
    kwargs = dict(mutable=["batch_stats"], rngs={"dropout": jax.random.key(3)})
    out_e = LinenBlock().apply(variables, x, train, n, **kwargs)
    out_a = jaxaot.nn.aot_module(LinenBlock()).apply(variables, x, train, n, **kwargs)
    assert trees_close(out_e, out_a)


class LinenParent(nn.Module):
    wrap: bool

    @nn.compact
    def __call__(self, x, train):
        block = jaxaot.nn.aot_module(LinenBlock()) if self.wrap else LinenBlock()
        return block(x, train, 2)


def test_linen_submodule_reads_python_arguments_as_flax():
    x = _x(40)
    results = []
    for wrap in (False, True):
        variables = LinenParent(wrap).init(jax.random.key(0), x, False)
        results.append(LinenParent(wrap).apply(variables, x, False, mutable=["batch_stats"]))
    assert trees_close(*results)


class SequentialParent(nn.Module):
    @nn.compact
    def __call__(self, x):
        return jaxaot.nn.aot_module(nn.Sequential((nn.Dense(4), nn.Dense(2))))(x)


def test_submodules_bound_to_the_parent_are_named_in_the_error():
    with pytest.raises(StaticArgumentError, match=r"Sequential.layers holds Linen modules bound to another module "
                                                  r"\(Dense Dense_0, Dense Dense_1, built inside SequentialParent"):
        SequentialParent().init(jax.random.key(0), _x(50, (3, 5)))


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Sequential([nn.Dense(4), nn.Dense(2)])(x)


class BlockParent(nn.Module):
    wrap: bool

    @nn.compact
    def __call__(self, x):
        return (jaxaot.nn.aot_module(Block()) if self.wrap else Block())(x)


def test_the_errors_remedy_runs_as_flax():
    x = _x(51, (3, 5))
    variables = BlockParent(False).init(jax.random.key(0), x)
    assert trees_close(variables, BlockParent(True).init(jax.random.key(0), x))
    assert trees_close(BlockParent(False).apply(variables, x), BlockParent(True).apply(variables, x))
