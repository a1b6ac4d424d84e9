"""``jaxaot.config``: every setting checked when set and when read from the environment, overrides that
restore, each setting's effect where it is used, and no other module reading ``JAXAOT_`` variables."""

from __future__ import annotations

import ast
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxaot
from jaxaot._src import compat as C
from jaxaot._src import progress
from jaxaot._src.compile import store
from jaxaot._src.config import SETTINGS, Config
from jaxaot._src.loops import checkpointed, offline, segments
from jaxaot.errors import InvalidValueError
from zoo import child_env

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jaxaot"

#: name -> (values it takes, as stored; values it refuses)
VALUES = {
    "cache_dir": ([("/tmp/c", "/tmp/c"), (Path("/tmp/c"), Path("/tmp/c")), (None, None)],
                  [42, b"/tmp/c", "", ["/tmp"], "/tmp/a\0b"]),
    "cache_key_file": ([("/tmp/k", "/tmp/k"), (Path("/tmp/k"), Path("/tmp/k")), (None, None)],
                       [3.5, b"/tmp/k", "", object(), Path("/tmp/k\0")]),
    "quiet": ([(True, True), (False, False)], [1, "yes", None, np.True_]),
    "online_block": ([(1, 1), (7, 7), (np.int32(2), 2), (None, None)], [0, -3, 2.5, True, "4", 2**70, (1 << 16) + 1]),
    "offline_schedule": ([("nested", "nested"), ("binomial", "binomial"), (None, None), (np.str_("nested"), "nested")],
                         ["fast", "Nested", 1, np.array("nested")]),
    "blocked_loops": ([(True, True), (False, False)], [None, 1, "true"]),
    "unroll_blocks": ([(True, True), (False, False)], [None, 0, "no"]),
    "stack_segments": ([(True, True), (False, False), (None, None)], [0, "1", []]),
    "start_steps_ahead": ([(True, True), (False, False)], [None, 1, "yes"]),
    "provisional_steps": ([(True, True), (False, False)], [None, 1, "off"]),
    "tune_in_background": ([(True, True), (False, False)], [None, 0, "on"]),
    "compiled_autograd_cache_size": ([(1, 1), (4096, 4096), (np.int64(9), 9)], [0, -1, 2.0, True, None, "8", 2**21]),
}
#: name -> (environment text, value; text it refuses). Paths take any text.
ENV = {
    "cache_dir": ([("/some/where", "/some/where")], []),
    "cache_key_file": ([("/some/key", "/some/key")], []),
    "quiet": ([("1", True), ("Off", False), (" yes ", True), ("0", False)], ["maybe", "2"]),
    "online_block": ([("3", 3), (" 12 ", 12), ("+4", 4)], ["x", "0", "-1", "1.5", "1180591620717411303424", "1_000",
                                                          "\u0663", "--2"]),
    "offline_schedule": ([("nested", "nested"), ("binomial", "binomial"), (" nested ", "nested")], ["fast"]),
    "blocked_loops": ([("true", True), ("no", False)], ["2"]),
    "unroll_blocks": ([("off", False), ("1", True)], ["twice"]),
    "stack_segments": ([("0", False), ("1", True)], ["none"]),
    "start_steps_ahead": ([("off", False), ("on", True)], ["later"]),
    "provisional_steps": ([("1", True), ("false", False)], ["soon"]),
    "tune_in_background": ([("no", False), ("true", True)], ["sometimes"]),
    "compiled_autograd_cache_size": ([("64", 64), (" 8 ", 8)], ["0", "many", "1e3"]),
}


@pytest.fixture
def clean_env(monkeypatch):
    """No ``JAXAOT_`` setting in the environment: a fresh ``Config()`` holds the defaults."""
    for s in SETTINGS.values():
        monkeypatch.delenv(s.env, raising=False)
    return monkeypatch


def test_the_tables_cover_every_setting():
    assert set(VALUES) == set(ENV) == set(SETTINGS)
    assert all(s.env == "JAXAOT_" + name.upper() for name, s in SETTINGS.items())


# --------------------------------------------------------------------------- checks when set
@pytest.mark.parametrize("name", sorted(VALUES))
def test_each_setting_takes_good_values_and_refuses_bad_ones_keeping_the_old(name, clean_env):
    good, bad = VALUES[name]
    c = Config()
    assert getattr(c, name) == SETTINGS[name].default
    for value, stored in good:
        setattr(c, name, value)
        assert getattr(c, name) == stored and type(getattr(c, name)) is type(stored)
    before = getattr(c, name)
    for value in bad:
        with pytest.raises(InvalidValueError, match=rf"jaxaot\.config\.{name} = "):
            setattr(c, name, value)
        assert getattr(c, name) == before
        with pytest.raises(InvalidValueError, match=name):
            Config(**{name: value})
        with pytest.raises(InvalidValueError), c.override(**{name: value}):
            pass  # pragma: no cover
        assert getattr(c, name) == before


def test_a_wrong_cache_dir_raises_when_set_not_at_the_next_compile():
    with pytest.raises(InvalidValueError, match="expected a path .* got int.*None turns the cache off"):
        jaxaot.config.cache_dir = 42
    assert jaxaot.config.cache_dir is None or isinstance(jaxaot.config.cache_dir, (str, Path))


def test_a_refused_bool_names_its_type_by_module():
    with pytest.raises(InvalidValueError, match=r"expected True or False, got numpy\.bool_? np\.True_"):
        Config().quiet = np.True_


def test_unknown_settings_raise_attribute_error_naming_the_settings():
    names = ", ".join(SETTINGS)
    with pytest.raises(AttributeError, match=f"no setting 'cache_size'; the settings are {names}"):
        jaxaot.config.cache_size = 1
    with pytest.raises(AttributeError, match="no setting 'cache_size'"):
        jaxaot.config.cache_size
    with pytest.raises(AttributeError, match="no setting 'cache_size'"), jaxaot.config.override(cache_size=1):
        pass  # pragma: no cover
    with pytest.raises(AttributeError, match="no setting"):
        Config(cache_size=1)
    with pytest.raises(AttributeError, match="cannot be deleted"):
        del jaxaot.config.quiet
    assert set(SETTINGS) <= set(dir(jaxaot.config)) and not hasattr(jaxaot.config, "cache_size")


# --------------------------------------------------------------------------- the environment
@pytest.mark.parametrize("name", sorted(ENV))
def test_the_environment_is_read_once_at_construction_and_checked(name, clean_env):
    env = SETTINGS[name].env
    good, bad = ENV[name]
    for text, value in good:
        clean_env.setenv(env, text)
        c = Config()
        assert getattr(c, name) == value
        clean_env.delenv(env)
        assert getattr(c, name) == value  # read once: the variable's later changes do not reach c
    clean_env.setenv(env, "")
    assert getattr(Config(), name) == SETTINGS[name].default  # empty: the default
    for text in bad:
        clean_env.setenv(env, text)
        with pytest.raises(InvalidValueError, match=rf"environment variable {env}={re.escape(repr(text))}: .*unset"):
            Config()
        assert getattr(Config(**{name: SETTINGS[name].default}), name) == SETTINGS[name].default


def test_config_reads_the_environment_when_first_used():
    code = ("import jaxaot; c = jaxaot.config; "
            "print(c.cache_dir, c.quiet, c.online_block, c.offline_schedule, c.blocked_loops, c.stack_segments)")
    env = dict(child_env(), JAXAOT_CACHE_DIR="/some/where", JAXAOT_QUIET="1", JAXAOT_ONLINE_BLOCK="5",
               JAXAOT_OFFLINE_SCHEDULE="nested", JAXAOT_BLOCKED_LOOPS="1", JAXAOT_STACK_SEGMENTS="0")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.stdout.split() == ["/some/where", "True", "5", "nested", "True", "False"], r.stderr[-2000:]
    env["JAXAOT_OFFLINE_SCHEDULE"] = "fast"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "InvalidValueError: environment variable JAXAOT_OFFLINE_SCHEDULE='fast'" in r.stderr
    r = subprocess.run([sys.executable, "-c", "import jaxaot; jaxaot.aot_function"], capture_output=True, text=True,
                       env=env, timeout=120)  # any name that reads the settings loads them first
    assert r.returncode != 0 and "JAXAOT_OFFLINE_SCHEDULE='fast'" in r.stderr


def test_a_bad_environment_variable_once_fixed_leaves_jaxaot_working():
    """The first use refuses the bad value; with the variable fixed, the next use loads everything (the modules
    the failed import had begun are imported again, and JAX's config states they made are reused)."""
    code = ("import os, jax.numpy as jnp, jaxaot\n"
            "try:\n    jaxaot.aot_function(jnp.sum)(jnp.ones(3))\n"
            "except jaxaot.errors.InvalidValueError as e:\n    print('refused')\n"
            "del os.environ['JAXAOT_ONLINE_BLOCK']\n"
            "x = jnp.arange(3.0)\n"
            "print(float(jaxaot.grad(jaxaot.aot_function(lambda x: jnp.sum(x ** 2)))(x)[2]), jaxaot.config.online_block)")
    env = dict(child_env(), JAXAOT_ONLINE_BLOCK="abc")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.stdout.split() == ["refused", "4.0", "None"], r.stderr[-2000:]


# --------------------------------------------------------------------------- overrides
def test_override_restores_on_exit_on_an_exception_and_nested(clean_env):
    c = Config()
    with c.override(quiet=True, online_block=3) as same:
        assert same is c and (c.quiet, c.online_block) == (True, 3)
        with c.override(online_block=5, offline_schedule="nested"):
            assert (c.quiet, c.online_block, c.offline_schedule) == (True, 5, "nested")
        assert (c.quiet, c.online_block, c.offline_schedule) == (True, 3, None)
    assert (c.quiet, c.online_block) == (False, None)
    with pytest.raises(KeyError), c.override(cache_dir="/tmp/x"):
        raise KeyError
    assert c.cache_dir is None


def test_override_checks_every_change_before_applying_any(clean_env):
    c = Config()
    with pytest.raises(InvalidValueError, match="online_block"), c.override(quiet=True, online_block=0):
        pass  # pragma: no cover
    assert (c.quiet, c.online_block) == (False, None)


def test_a_setting_assigned_inside_an_override_lasts_until_it_ends(clean_env):
    c = Config()
    with c.override(online_block=2):
        c.online_block = 6
        c.quiet = True  # not overridden: set for good
        assert c.online_block == 6
    assert (c.online_block, c.quiet) == (None, True)


def test_overrides_left_in_another_order_restore_what_was_set_outside(clean_env):
    c = Config()
    first, second = c.override(online_block=2), c.override(online_block=3)
    first.__enter__()
    second.__enter__()
    assert c.online_block == 3
    first.__exit__(None, None, None)  # the older one ends first (another thread's, say)
    assert c.online_block == 3
    second.__exit__(None, None, None)
    assert c.online_block is None


def test_concurrent_overrides_leave_the_settings_as_they_were(clean_env):
    c = Config(online_block=9)
    errors = []

    def worker(i):
        try:
            for j in range(200):
                with c.override(online_block=1 + (i + j) % 5, quiet=bool(j % 2)):
                    assert c.online_block in (1, 2, 3, 4, 5)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and (c.online_block, c.quiet) == (9, False)


# --------------------------------------------------------------------------- where each setting acts
def _loss(x, **options):
    out = jaxaot.loops.while_loop(lambda c: c[0] < 30, lambda c: (c[0] + 1, jnp.sin(c[1]) * 1.1), (0, x), **options)
    return jnp.sum(out[1])


def _scan_grad(x):
    return jax.grad(lambda x: jnp.sum(lax.scan(lambda c, _: (jnp.sin(c) * 1.1, None), x, None, length=30)[0]))(x)


def _primitives(fn, x):
    return [str(e.primitive) for e in C.iter_eqns(jax.make_jaxpr(fn)(x))]


def test_quiet_silences_progress(caplog):
    caplog.set_level(logging.INFO, logger="jaxaot")
    with jaxaot.config.override(quiet=True):
        assert progress.quiet() and not progress.enabled()
        progress.step("timing ops", 1, 2)
    with jaxaot.config.override(quiet=False):
        assert progress.enabled()
        progress.step("compiling", 1, 1)
    assert [r.getMessage() for r in caplog.records if r.name == "jaxaot"] == ["compiling: 1/1"]


def test_offline_schedule_picks_a_bounded_loops_schedule():
    x = jnp.float32(0.7)
    grad = jax.grad(lambda x: _loss(x, max_steps=100, checkpoints=16))
    compiled = jax.jit(grad)  # one function: the setting is part of JAX's cache keys
    with jaxaot.config.override(offline_schedule="nested"):
        assert offline.schedule() == "nested"
        nested = _primitives(grad, x)
        got_nested = compiled(x)
    with jaxaot.config.override(offline_schedule="binomial"):
        assert offline.schedule() == "binomial"
        binomial = _primitives(grad, x)
        binomial_scans = {e.params["length"] for e in C.iter_eqns(jax.make_jaxpr(grad)(x)) if str(e.primitive) == "scan"}
        got_binomial = compiled(x)
    assert "scan" in nested and "while_loop" not in nested  # nested scans of static lengths
    # run-time trip counts; the only scans are the online blocks' (one block per predicate check: 4 on GPUs)
    assert "while_loop" in binomial and binomial_scans <= {checkpointed.online_block()} - {1}
    chex.assert_trees_all_close((got_nested, got_binomial), (_scan_grad(x),) * 2, rtol=1e-5)


def test_a_function_jax_compiled_is_traced_again_under_other_loop_settings():
    traces = []

    def f(x):
        traces.append(1)
        return _loss(x, max_steps=100, checkpoints=16)

    g = jax.jit(jax.grad(f))
    x = jnp.float32(0.3)
    g.lower(x)
    with jaxaot.config.override(quiet=True):  # a setting no program depends on: JAX's trace serves
        g.lower(x)
    assert len(traces) == 1
    for schedule in ("nested", "binomial", "nested"):
        with jaxaot.config.override(offline_schedule=schedule):
            g.lower(x)
    assert len(traces) == 3  # both schedules traced; nested again served from JAX's cache
    g.lower(x)
    assert len(traces) == 3


def test_online_block_sets_the_steps_per_check():
    x = jnp.float32(0.4)
    grad = lambda x: jax.grad(lambda x: _loss(x, checkpoints=4))(x)  # noqa: E731
    programs = {}
    for block in (1, 3):
        with jaxaot.config.override(online_block=block):
            assert checkpointed.online_block() == block
            programs[block] = _primitives(grad, x)
    assert programs[3].count("scan") > programs[1].count("scan")  # blocks: fixed-length runs of 3 steps
    # (tests/loops/test_checkpointed.py compares the blocked schedule's gradients with lax.scan's)


def test_blocked_loops_lowers_loops_in_blocks_on_this_platform():
    x = jnp.float32(0.4)
    whiles, got = {}, {}
    for blocked in (False, True):
        with jaxaot.config.override(blocked_loops=blocked):
            g = jax.jit(jax.grad(lambda x: _loss(x, max_steps=64)))  # a new function: lowered again
            whiles[blocked] = g.lower(x).as_text().count("stablehlo.while")
            got[blocked] = g(x)
    on_gpu = jax.default_backend() in ("gpu", "cuda", "rocm")
    assert whiles[True] > whiles[False] or on_gpu, whiles  # GPUs lower in blocks either way
    chex.assert_trees_all_close((got[False], got[True]), (_scan_grad(x),) * 2, rtol=1e-5)


def test_stack_segments_decides_where_stacks_run_in_segments():
    eqn = jax.make_jaxpr(lambda x: jaxaot.loops.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 1.5),
                                                           (0, x), max_steps=1000))(1.0).eqns[0]
    loop = jaxaot._src.loops.common.loop_of(eqn.primitive, eqn.params)
    big = [jax.ShapeDtypeStruct((1024,), jnp.float32)]  # a 4 MiB stack
    with jaxaot.config.override(stack_segments=True):
        assert segments.segments_here() and segments.applies(loop, big) == 64
    with jaxaot.config.override(stack_segments=False):
        assert not segments.segments_here() and segments.applies(loop, big) is None
    with jaxaot.config.override(stack_segments=None):
        assert segments.segments_here() == (jax.default_backend() == "cpu")


def test_cache_dir_and_cache_key_file_decide_where_the_cache_lives(tmp_path):
    x = jnp.arange(4.0)
    f = lambda v: jnp.sum(jnp.tanh(v) ** 2)  # noqa: E731
    key = tmp_path / "keys" / "key"
    with jaxaot.config.override(cache_dir=None, cache_key_file=key):
        assert store.cache_root() is None
        jax.grad(jaxaot.aot_function(f))(x)
    assert not key.exists()  # no cache: no key either
    with jaxaot.config.override(cache_dir=tmp_path / "cache", cache_key_file=key):
        assert store.key_path() == key
        got = jax.grad(jaxaot.aot_function(f))(x)
    entries = list((tmp_path / "cache").rglob("*.bin"))
    assert key.is_file() and entries, entries
    np.testing.assert_allclose(got, jax.grad(f)(x), rtol=1e-6)


@pytest.mark.parametrize("kind", [str, Path])
def test_a_path_under_the_home_folder_is_expanded_as_a_shell_would(kind, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    sub = f"jaxaot-{np.random.randint(1 << 30)}"
    with jaxaot.config.override(cache_dir=kind(f"~/{sub}"), cache_key_file=kind(f"~/{sub}/key")):
        assert os.fspath(jaxaot.config.cache_dir) == os.fspath(jaxaot.config.cache_key_file)[: -len("/key")]
        assert os.fspath(jaxaot.config.cache_dir) == str(tmp_path / sub)
        assert isinstance(jaxaot.config.cache_dir, kind)
    from jaxaot._src.config import SETTINGS

    assert SETTINGS["cache_dir"].from_env({"JAXAOT_CACHE_DIR": f"~/{sub}"}) == str(tmp_path / sub)


# --------------------------------------------------------------------------- no other reader; the docs
_ENV_NAME = re.compile(r"^JAXAOT_[A-Z0-9_]+$")


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


def _environment_readers(source: str) -> list[str]:
    """Where ``source`` reads the environment with a key that is not a literal other than ``JAXAOT_...``, or
    names a ``JAXAOT_`` variable (an indirection a reader could use)."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        read, key = False, None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _ENV_NAME.match(node.value):
            hits.append(f"line {node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Call):
            f = node.func
            lookup = isinstance(f, ast.Attribute) and f.attr in ("get", "pop", "setdefault") and _is_environ(f.value)
            getenv = (isinstance(f, ast.Attribute) and f.attr == "getenv") or (isinstance(f, ast.Name) and f.id == "getenv")
            read = lookup or getenv
            key = node.args[0] if node.args else None
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            read, key = True, node.slice
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            read, key = True, node.left
        literal = isinstance(key, ast.Constant) and isinstance(key.value, str) and not key.value.startswith("JAXAOT_")
        if read and not literal:
            hits.append(f"line {node.lineno}: reads the environment with {ast.unparse(key) if key else 'no key'}")
    return hits


def test_the_reader_check_catches_a_reader():
    assert _environment_readers('import os\nx = os.environ.get("JAXAOT_QUIET")\n')
    assert _environment_readers('import os\nNAME = "JAXAOT_X"\nx = os.getenv(NAME)\n')
    assert _environment_readers('import os\nx = os.environ["JAXAOT_" + "QUIET"]\n')
    assert _environment_readers('from os import environ\nx = ("JAXAOT_" + name.upper()) in environ\n')
    assert not _environment_readers('import os\nx = os.environ.get("XLA_FLAGS")\n"""JAXAOT_QUIET=1 silences it."""\n')


def test_no_module_but_config_reads_jaxaot_variables():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "jaxaot/_src/config.py":
            continue
        hits = _environment_readers(path.read_text())
        if hits:
            found[rel] = hits
    assert not found, f"read JAXAOT_ variables through jaxaot.config (jaxaot/_src/config.py) instead: {found}"


def test_the_settings_page_tables_every_setting_and_its_code_runs(tmp_path):
    page = (ROOT / "docs" / "config.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| ([^|]+) \| `([^|`]+)` \|", page, flags=re.M)
    assert [(name, env) for name, env, _, _ in rows] == [(s.name, s.env) for s in SETTINGS.values()]
    assert [(kind, default) for _, _, kind, default in rows] == [(s.type, repr(s.default)) for s in SETTINGS.values()]
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert blocks
    script = tmp_path / "config_blocks.py"
    script.write_text("\n\n".join(blocks))
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=child_env())
    assert r.returncode == 0, r.stderr[-4000:]
    assert "jaxaot.config.cache_dir = 42" in r.stdout


def test_the_settings_page_is_linked_where_settings_are_mentioned():
    for page in ("index.md", "caching.md", "cli.md", "security.md", "guarantees.md", "concepts/loops.md"):
        text = (ROOT / "docs" / page).read_text()
        assert re.search(r"(^config$|config\.md|\{doc\}`(\.\./)?config`)", text, flags=re.M), page


def test_a_watcher_that_is_not_callable_or_fails_is_not_kept_and_overrides_restore():
    config = jaxaot.config
    before = config.online_block
    with pytest.raises(jaxaot.errors.InvalidInputError):
        config.watch(5)

    def failing(_):
        raise ValueError("a watcher's own error")

    with pytest.raises(ValueError):
        config.watch(failing)
    seen = []
    config.watch(seen.append)
    try:
        with config.override(online_block=3):
            assert config.online_block == 3
        assert config.online_block == before and len(seen) == 3  # the settings and the watchers work on
    finally:
        config._watchers.remove(seen.append)


def test_an_override_whose_watcher_raises_leaves_nothing_behind():
    config = jaxaot.config
    before, calls = config.online_block, []

    def refuses_three(c):
        calls.append(c.online_block)
        if c.online_block == 3:
            raise ValueError("refused")

    config.watch(refuses_three)
    try:
        with pytest.raises(ValueError):
            with config.override(online_block=3):
                pass
        assert config.online_block == before
    finally:
        config._watchers.remove(refuses_three)
