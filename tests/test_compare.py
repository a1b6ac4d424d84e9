"""``jaxaot.compare``: its rows measure the programs they name, compute what JAX computes, and bad options fail early."""

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from zoo import assert_trees_close, key_stream, mlp_args, mlp_gelu

import jaxaot
from jaxaot._src.compare import REFERENCE, max_abs_diff, time_rounds
from jaxaot._src.partition import compiled_peak
from jaxaot.errors import InvalidInputError, InvalidValueError

INSPECTING = Path(__file__).resolve().parent.parent / "docs" / "inspecting.md"
fresh_key = key_stream(2100)


@pytest.fixture(scope="module")
def mlp():
    """The zoo's MLP on fresh random inputs, and its comparison at two budgets and two policies."""
    args = mlp_args(jax.random.key(11))
    result = jaxaot.compare(mlp_gelu, *args, budgets=(1.0, "0.0"), policies=("dots_saveable", "nothing_saveable"),
                            rounds=2, calls=1)
    return args, result


def test_rows_are_the_programs_asked_for(mlp):
    _, result = mlp
    assert [(r.name, r.kind) for r in result.rows] == [
        ("jaxaot memory_budget=1.0", "jaxaot"), ("jaxaot memory_budget=0.0", "jaxaot"), (REFERENCE, "jax"),
        ("jax.checkpoint(dots_saveable)", "jax"), ("jax.checkpoint(nothing_saveable)", "jax")]
    assert result.reference is result.row(REFERENCE) and (result.rounds, result.calls) == (2, 1)
    for r in result.rows:
        assert len(r.times) == 2 and all(t > 0 for t in r.times)
        assert r.step_spread[0] <= r.step_seconds <= r.step_spread[1]
    with pytest.raises(KeyError, match="no row 'jaxaot memory_budget=0.5'"):
        result.row("jaxaot memory_budget=0.5")


def test_jax_rows_peaks_are_their_programs_compiled_peaks(mlp):
    args, result = mlp
    in_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(args))
    for name, loss in ((REFERENCE, mlp_gelu),
                       ("jax.checkpoint(dots_saveable)",
                        jax.checkpoint(mlp_gelu, policy=jax.checkpoint_policies.dots_saveable)),
                       ("jax.checkpoint(nothing_saveable)",
                        jax.checkpoint(mlp_gelu, policy=jax.checkpoint_policies.nothing_saveable))):
        exe = jax.jit(jax.value_and_grad(loss)).lower(*args).compile()
        assert exe.memory_analysis() is not None
        assert result.row(name).peak_bytes == compiled_peak(exe), name
    for r in result.rows:  # every step holds at least its inputs at its peak
        assert r.peak_bytes is not None and r.peak_bytes >= in_bytes, r


def test_every_row_computes_jax_value_and_grad(mlp):
    args, result = mlp
    assert all(r.max_abs_diff < 1e-5 for r in result.rows), [(r.name, r.max_abs_diff) for r in result.rows]
    want = jax.jit(jax.value_and_grad(mlp_gelu))(*args)
    # The program compare timed at budget 0 (recomputing all it can), built again: jaxaot's gradient is jax.grad's.
    pf = jaxaot.partition.min_cut_rematerialization_partition(memory_budget=0.0)
    assert_trees_close(jaxaot.value_and_grad(jaxaot.aot_function(mlp_gelu, partition_fn=pf))(*args), want)


def test_the_table_and_the_json(mlp):
    _, result = mlp
    text = str(result)
    for r in result.rows:
        line = next(line for line in text.splitlines() if line.startswith(r.name + " "))
        assert re.search(r"\d+(\.\d+)? (B|KiB|MiB|GiB)", line), line
        assert re.search(r"[\d.]+ \([\d.]+-[\d.]+\)", line), line
    assert "step times compared within each round" in text
    doc = json.loads(json.dumps(result.to_dict()))
    assert doc["reference"] == REFERENCE and doc["rounds"] == 2
    assert [(d["name"], d["peak_bytes"]) for d in doc["rows"]] == [(r.name, r.peak_bytes) for r in result.rows]


def test_argnums_picks_the_differentiated_argument():
    w, x = jax.random.normal(jax.random.key(3), (6, 4)), jax.random.normal(jax.random.key(4), (5, 6))
    loss = lambda w, x: jnp.mean(jnp.sin(x @ w) ** 2)  # noqa: E731
    result = jaxaot.compare(loss, w, x, budgets=(0.0,), argnums=1, policies={"mine": jax.checkpoint_policies.
                                                                           everything_saveable}, rounds=1, calls=1)
    assert [r.name for r in result.rows] == ["jaxaot memory_budget=0.0", REFERENCE, "jax.checkpoint(mine)"]
    assert all(r.max_abs_diff < 1e-5 for r in result.rows)


@pytest.mark.parametrize("argnums", [-1, np.int64(1), (np.int32(0), -1), [-2]])
def test_argnums_are_read_as_jax_reads_them(argnums):
    """Negative ``argnums`` count from the end and NumPy integers are integers, as in ``jax.value_and_grad``; counts
    may be NumPy integers too."""
    w, x = jax.random.normal(fresh_key(), (6, 4)), jax.random.normal(fresh_key(), (5, 6))
    loss = lambda w, x: jnp.mean(jnp.sin(x @ w) ** 2)  # noqa: E731
    result = jaxaot.compare(loss, w, x, budgets=(0.0,), argnums=argnums, policies=("nothing_saveable",),
                            rounds=np.int64(1), calls=np.int32(1))
    assert (result.rounds, result.calls) == (1, 1) and type(result.calls) is int
    assert all(r.max_abs_diff < 1e-5 for r in result.rows)
    assert "1 round of 1 call," in str(result)
    want = jax.value_and_grad(loss, argnums=argnums)(w, x)
    got = jaxaot.value_and_grad(loss, argnums=argnums)(w, x)
    assert_trees_close(got, want)


@pytest.mark.parametrize("call, error, msg", [
    (lambda f, a: jaxaot.compare(f, *a, budgets=[2.5]), InvalidValueError, "memory_budget=2.5 is above 1.*'2.5GB'"),
    (lambda f, a: jaxaot.compare(f, *a, budgets=["1.2xB"]), InvalidValueError, "unknown unit 'xB'"),
    (lambda f, a: jaxaot.compare(f, *a, budgets=[None]), InvalidInputError, "memory_budget must be"),
    (lambda f, a: jaxaot.compare("loss", *a), InvalidInputError, "compare expects a callable fn"),
    (lambda f, a: jaxaot.compare(f, *a, budgets=0.5), InvalidInputError, "budgets=\\(0.5,\\)"),
    (lambda f, a: jaxaot.compare(f, *a, budgets=()), InvalidValueError, "budgets of compare is empty"),
    (lambda f, a: jaxaot.compare(f, *a, budgets=(0.5, 0.5)), InvalidValueError, "repeats a budget"),
    (lambda f, a: jaxaot.compare(f, *a, argnums=2), InvalidValueError, "argnums=2 of compare, but fn is given 2"),
    (lambda f, a: jaxaot.compare(f, *a, argnums="0"), InvalidInputError, "argnums of compare must be"),
    (lambda f, a: jaxaot.compare(f, *a, argnums=-3), InvalidValueError, "argnums=-3 of compare.*from -2 to 1"),
    (lambda f, a: jaxaot.compare(f, *a, argnums=(0, -2)), InvalidInputError, "names an argument more than once"),
    (lambda f, a: jaxaot.compare(f, *a, argnums=np.float32(1)), InvalidInputError, "argnums of compare must be"),
    (lambda f, a: jaxaot.compare(f, *a, calls=1.0), InvalidInputError, "calls of compare must be an integer"),
    (lambda f, a: jaxaot.compare(f, *a, policies=["dots_saved"]), InvalidValueError,
     "unknown checkpoint policies \\['dots_saved'\\].*dots_saveable"),
    (lambda f, a: jaxaot.compare(f, *a, policies="dots_saveable"), InvalidInputError, "policies of compare must be"),
    (lambda f, a: jaxaot.compare(f, *a, rounds=0), InvalidValueError, "rounds of compare must be at least 1"),
    (lambda f, a: jaxaot.compare(f, *a, calls=True), InvalidInputError, "calls of compare must be an int"),
    (lambda f, a: jaxaot.compare(f, jax.ShapeDtypeStruct((6, 4), jnp.float32), a[1]), InvalidInputError,
     "args\\[0\\] is a jax.ShapeDtypeStruct"),
])
def test_bad_options_raise_typed_errors_before_tracing(call, error, msg):
    traced = []

    def loss(w, x):
        traced.append(1)
        return jnp.sum(x @ w)

    with pytest.raises(error, match=msg):
        call(loss, (jnp.ones((6, 4)), jnp.ones((5, 6))))
    assert traced == []


def test_max_abs_diff_sees_any_difference():
    a = ({"w": jnp.ones(3)}, jnp.float32(2.0))
    assert max_abs_diff(a, a) == 0.0
    assert max_abs_diff(a, ({"w": jnp.array([1.0, 1.0, -1.0])}, jnp.float32(2.5))) == 2.0
    assert max_abs_diff(a, ({"w": jnp.ones(3)},)) == float("inf")  # a leaf missing


def test_time_rounds_takes_turns():
    calls = []
    seconds = time_rounds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=2, calls=1)
    assert calls == ["a", "a", "b", "b", "a", "b", "a", "b"]  # warm-up, then one call each per round
    assert len(seconds["a"]) == len(seconds["b"]) == 2


def test_the_inspecting_page_example_runs_as_written(capsys):
    section = INSPECTING.read_text().split("## Comparing with JAX", 1)[1]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    exec(compile(block, str(INSPECTING), "exec"), {})
    out = capsys.readouterr().out
    assert "jaxaot memory_budget=0.0" in out and "jax.checkpoint(nothing_saveable)" in out and REFERENCE in out


def test_a_nan_anywhere_in_the_gradients_makes_the_difference_nan_and_policies_may_not_take_reserved_names():
    assert np.isnan(max_abs_diff((1.0, [np.array([np.nan, 1.0])]), (1.0, [np.ones(2)])))
    assert max_abs_diff((1.0, [np.array([np.inf])]), (1.0, [np.array([np.inf])])) == 0.0  # equal infinities
    with pytest.raises(InvalidValueError, match="names of the reference"):
        jaxaot.compare(lambda w: jnp.sum(w ** 2), jnp.ones(3), budgets=(1.0,), rounds=1, calls=1,
                       policies={"jax.jit(jax.value_and_grad)": jax.checkpoint_policies.nothing_saveable})


def test_a_policy_jax_checkpoint_refuses_is_a_typed_error_naming_the_way_out():
    """``jax.checkpoint`` refuses a function with an ``io_callback`` under a policy: ``compare`` says so with a typed
    error naming ``policies=()``, with which jaxaot's rows and jit's compare the function as JAX computes it."""
    from jax.experimental import io_callback

    def loss(w, x):
        y = jnp.tanh(x @ w)
        io_callback(lambda a: a, jax.ShapeDtypeStruct((), y.dtype), jax.lax.stop_gradient(y[0, 0]))  # a logger
        return jnp.sum(y ** 2)

    w, x = jax.random.normal(fresh_key(), (6, 4)), jax.random.normal(fresh_key(), (5, 6))
    with pytest.raises(InvalidInputError, match=r"dots_saveable.*policies=\(\)"):
        jaxaot.compare(loss, w, x, budgets=(0.5,), policies=("dots_saveable",), rounds=1, calls=1)
    result = jaxaot.compare(loss, w, x, budgets=(0.5,), policies=(), rounds=1, calls=1)
    assert [r.name for r in result.rows] == ["jaxaot memory_budget=0.5", REFERENCE]
    assert all(r.max_abs_diff < 1e-5 for r in result.rows)
