"""Attacks on the op-cost tables the min-cut keeps under ``cache_dir``: each refused as the cache's entries are.

The tables were read with ``Path.read_text``: a FIFO there hung ``jax.grad``
under ``min_cut(memory_budget=0.5, op_costs="measured")``, a symlink to
``/dev/zero`` ate 4.3 GiB and raised ``MemoryError``, 200,000 nested ``[``
escaped as ``RecursionError``, and a 0777 cache folder that the compile cache
refuses was still used. Each is ignored with a warning (and the table
rebuilt, or kept in memory where others could write its folder).
"""

from __future__ import annotations

import functools
import json
import os
import resource
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src.partition.costs import measured_costs
from jaxaot._src.partition.costs.measured_costs import MAX_TABLE_BYTES, MeasuredCosts
from reliability.hostile import deadline


@pytest.fixture
def table(tmp_path):
    """The op-cost table's path under a fresh cache_dir (the folders made, as jaxaot makes them)."""
    with jaxaot.config.override(cache_dir=str(tmp_path / "cache")):
        path = measured_costs._default_path(jax.devices()[0], jaxaot.config.cache_dir)
        path.parent.mkdir(mode=0o700, parents=True)
        for d in (path.parent, path.parent.parent, path.parent.parent.parent):
            d.chmod(0o700)
        yield path


def _valid(path, seconds=1.0) -> None:
    record = {"environment": measured_costs._environment(jax.devices()[0]), "seconds": {"planted-op": seconds}}
    path.write_text(json.dumps(record))
    path.chmod(0o600)


def _costs(**kw) -> tuple[MeasuredCosts, list[str]]:
    with warnings.catch_warnings(record=True) as caught, deadline(30):
        warnings.simplefilter("always")
        costs = MeasuredCosts(jax.devices()[0], **kw)
    return costs, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_a_valid_table_is_read(table):
    _valid(table, 0.25)
    costs, messages = _costs()
    assert costs._table == {"planted-op": 0.25} and not messages


def _fifo(p):
    os.mkfifo(p)


def _dev_zero(p):
    p.symlink_to("/dev/zero")


def _huge(p):
    with open(p, "wb") as f:
        f.truncate(MAX_TABLE_BYTES + 1)


def _nested(p):
    p.write_text('{"seconds": ' + "[" * 200_000 + "]" * 200_000 + "}")


def _directory(p):
    p.mkdir()


@pytest.mark.parametrize("plant,match", [
    (_fifo, "is a FIFO, not a regular file"), (_dev_zero, "is a symlink, not a regular file"),
    (_huge, f"more than the limit of {MAX_TABLE_BYTES}"), (_nested, "NestingError: JSON nested 200001 levels deep"),
    (_directory, "is a directory, not a regular file")])
def test_a_planted_table_is_ignored_in_seconds(table, plant, match):
    plant(table)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    costs, messages = _costs()
    assert costs._table == {} and costs._path == table  # rebuilt on the next measurement
    assert any(match in m for m in messages), messages
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB


@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_folder_others_can_write_is_neither_read_nor_written(table, level, mode):
    _valid(table)
    folder = [table.parent, table.parent.parent, table.parent.parent.parent][level]
    folder.chmod(mode)
    try:
        costs, messages = _costs()
        assert costs._table == {} and costs._path is None  # kept in memory
        assert any("not using the op-cost table" in m and "writable by" in m for m in messages), messages
        before = table.read_bytes()
        eqn = jax.make_jaxpr(jnp.dot)(jnp.ones((64, 64)), jnp.ones((64, 64))).jaxpr.eqns[0]
        assert costs.seconds(eqn) > 0
        assert table.read_bytes() == before  # nothing written there
    finally:
        folder.chmod(0o700)
    costs, messages = _costs()
    assert costs._table == {"planted-op": 1.0} and not messages


def test_a_table_of_another_user_is_ignored(table, monkeypatch):
    _valid(table)
    monkeypatch.setattr(os, "getuid", lambda: table.stat().st_uid + 1)
    costs, messages = _costs()
    assert costs._table == {} and any("owned by uid" in m for m in messages), messages


def _loss(w, x):
    return jnp.sum(jnp.tanh(x @ w) ** 2)


def test_a_fifo_table_does_not_hang_a_measured_min_cut_gradient(table):
    _fifo(table)
    measured_costs._SHARED.clear()
    w, x = jax.random.normal(jax.random.key(0), (8, 8)), jax.random.normal(jax.random.key(1), (4, 8))
    part = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.5, op_costs="measured")
    with deadline(120), pytest.warns(RuntimeWarning, match="is a FIFO"):
        got = jax.grad(jaxaot.aot_function(_loss, partition_fn=part))(w, x)
    np.testing.assert_allclose(got, jax.grad(_loss)(w, x), rtol=1e-5, atol=1e-6)
    measured_costs._SHARED.clear()


def test_a_refused_folder_of_this_user_is_fixed_with_chmod(table):
    _valid(table)
    table.parent.chmod(0o770)
    try:
        _, messages = _costs()
    finally:
        table.parent.chmod(0o700)
    (message,) = [m for m in messages if "not using the op-cost table" in m]
    assert message.endswith(f"fix it with chmod 700 {table.parent}, or choose another jaxaot.config.cache_dir.")


@pytest.mark.parametrize("whose", ["sticky", "another user's"])
def test_a_refused_shared_or_foreign_folder_is_never_advised_chmod(table, monkeypatch, whose):
    _valid(table)
    if whose == "sticky":  # a folder like /tmp: everyone writes there, the sticky bit keeps their files apart
        table.parent.chmod(0o1777)
    else:
        monkeypatch.setattr(os, "getuid", lambda: os.stat(table.parent).st_uid + 1)
    try:
        _, messages = _costs()
    finally:
        table.parent.chmod(0o700)
    (message,) = [m for m in messages if "not using the op-cost table" in m]
    refused = table.parent if whose == "sticky" else table.parent.parent.parent  # the first folder checked
    assert "chmod" not in message
    why = "a shared temporary folder" if whose == "sticky" else "not a folder of yours"
    assert message.endswith(f"{refused} is {why}: leave its permissions alone and "
                            "set jaxaot.config.cache_dir (JAXAOT_CACHE_DIR) to a private folder of yours, such as "
                            "~/.cache/jaxaot.")
