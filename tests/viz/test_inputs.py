"""Every public jaxaot.viz function refuses a value of the wrong kind with a typed error, before drawing.

The error is :class:`jaxaot.errors.InvalidInputError` (a ``TypeError``) naming the function, what it was
given and what it expects; never an ``AttributeError`` from deep in the drawing.
"""

import inspect

import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot import viz
from jaxaot.errors import InvalidInputError, InvalidValueError
from jaxaot.parallel import one_f_one_b

#: Functions that take no argument, so no wrong one.
NO_ARGUMENTS = {"layout_available", "why_no_layout"}


def _wrong_values():
    """What is passed by mistake: a plain function, None, a string, an array of fresh random values, a number."""
    x = jnp.asarray(np.random.default_rng().normal(size=3), jnp.float32)
    return {"function": lambda v: v, "None": None, "str": "split", "array": x, "int": 3}


#: ``name -> (call of the wrong value, the words the message must hold)``; ``low``/``graph``: valid values.
CALLS = {
    "render": (lambda bad, low, graph: viz.render(bad), "AOTLowered"),
    "split_graph": (lambda bad, low, graph: viz.split_graph(bad), "AOTLowered"),
    "to_html": (lambda bad, low, graph: viz.to_html(bad), "AOTLowered"),
    "residual_table_html": (lambda bad, low, graph: viz.residual_table_html(bad), "AOTLowered"),
    "collapse": (lambda bad, low, graph: viz.collapse(bad, "line"), "SplitGraph"),
    "draw_svg": (lambda bad, low, graph: viz.draw_svg(bad), "SplitGraph"),
    "plain_svg": (lambda bad, low, graph: viz.plain_svg(bad), "SplitGraph"),
    "to_digraph": (lambda bad, low, graph: viz.to_digraph(bad), "SplitGraph"),
    "plot_budget_sweep": (lambda bad, low, graph: viz.plot_budget_sweep(bad), "(budget, saved_bytes"),
    "plot_pareto": (lambda bad, low, graph: viz.plot_pareto(bad), "(label, peak_bytes"),
    "plot_schedule": (lambda bad, low, graph: viz.plot_schedule(bad), "Schedule"),
}


def test_every_public_function_is_covered():
    functions = {n for n in viz.__all__ if inspect.isfunction(getattr(viz, n))}
    assert functions == set(CALLS) | NO_ARGUMENTS


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_wrong_kind_of_value_is_a_typed_error(name, small):
    call, expected = CALLS[name]
    graph = viz.split_graph(small)
    for what, bad in _wrong_values().items():
        with pytest.raises(InvalidInputError) as info:
            call(bad, small, graph)
        message = str(info.value)
        assert name in message and expected in message, (what, message)
        assert type(bad).__name__ in message or (bad is None and "None" in message), (what, message)


def test_the_message_says_what_was_meant(small):
    aot_fn = jaxaot.aot_function(lambda x: jnp.sin(x).sum())
    with pytest.raises(InvalidInputError, match=r"lower the function first: aot_fn\.lower"):
        viz.render(aot_fn)
    with pytest.raises(InvalidInputError, match="pass the lowered function, not an array"):
        viz.split_graph(_wrong_values()["array"])
    with pytest.raises(InvalidInputError, match=r"build one with jaxaot\.viz\.split_graph\(lowered\)"):
        viz.draw_svg(small)
    assert viz.split_graph(small.compile()) == viz.split_graph(small)  # the compiled split draws too


@pytest.mark.parametrize("options, error, words", [
    ({"max_nodes": "80"}, InvalidInputError, "max_nodes must be a positive int, got str"),
    ({"max_nodes": 0}, InvalidValueError, "max_nodes must be a positive int, got 0"),
    ({"title": None}, InvalidInputError, "title must be a str, got None"),
    ({"path": 3}, InvalidInputError, "path must be a str, an os.PathLike or None, got int"),
    ({"timeout": "5"}, InvalidInputError, "timeout must be a positive number"),
    ({"timeout": -1.0}, InvalidValueError, "timeout must be a positive number"),
    ({"timeout": float("inf")}, InvalidValueError, "timeout must be at most 86400 seconds"),
    ({"format": None}, InvalidValueError, "format must be 'svg', 'html' or 'dot', got None"),
    ({"group_by": "module"}, InvalidValueError, "render: group_by must be"),
    ({"max_nodes": np.float32(80)}, InvalidInputError, "render: max_nodes must be a positive int, got float32"),
])
def test_render_checks_its_options_before_drawing(small, tmp_path, options, error, words):
    with pytest.raises(error, match=words):
        viz.render(small, **{"path": tmp_path / "split", **options})
    assert not list(tmp_path.iterdir())


def test_plot_rows_of_the_wrong_shape_are_typed_errors():
    pytest.importorskip("matplotlib")
    with pytest.raises(InvalidInputError, match=r"row 1 must be a sequence \(budget"):
        viz.plot_budget_sweep([(0.0, 1, 0.1), (0.5, 2)])
    with pytest.raises(InvalidInputError, match="reference must be a sequence"):
        viz.plot_budget_sweep([(0.0, 1, 0.1)], reference=5)
    with pytest.raises(InvalidInputError, match="row 0 must be a sequence"):
        viz.plot_pareto(["dots"])
    rng = np.random.default_rng()
    rows = np.column_stack([np.linspace(0, 1, 4), rng.integers(1, 2**20, 4), rng.uniform(1e-3, 1e-2, 4)])
    assert len(viz.plot_budget_sweep(rows).axes) == 2  # a numpy array of rows is rows
    with pytest.raises(InvalidInputError, match="times must be"):
        viz.plot_schedule(one_f_one_b(2, 4), times=1.0)


def test_integer_scalars_count_nodes(small):
    """A NumPy or JAX integer is an int, as ``range`` takes it; the picture is the one an int gives."""
    n = int(np.random.default_rng().integers(3, 12))
    expected = viz.split_graph(small, max_nodes=n)
    for count in (np.int64(n), np.int32(n), jnp.asarray(n)):
        assert viz.split_graph(small, max_nodes=count) == expected
        assert viz.to_html(small, max_nodes=count) == viz.to_html(small, max_nodes=n)
    with pytest.raises(InvalidValueError, match="to_html: max_nodes must be a positive int, got 0"):
        viz.to_html(small, max_nodes=np.int64(0))


@pytest.mark.parametrize("module, call", [
    ("graphviz", lambda low: viz.render(low, format="dot")),
    ("graphviz", lambda low: viz.to_digraph(viz.split_graph(low))),
    ("matplotlib", lambda low: viz.plot_pareto([("jit", 1024, 1e-3)])),
    ("matplotlib", lambda low: viz.plot_schedule(one_f_one_b(2, 4))),
])
def test_a_missing_extra_says_how_to_install_it(small, monkeypatch, module, call):
    import sys
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: the import fails, as if not installed
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=rf"needs the '{module}' package.*pip install 'jaxaot\[viz\]'"):
        call(small)
