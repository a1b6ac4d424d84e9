"""Artifacts with symbolic dimensions, higher derivatives and wide dtypes: loaded functions against JAX.

Each artifact runs in memory and after a save and load, on fresh random inputs
of several sizes, and its values and gradients are compared with
``jax.value_and_grad`` of the function itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot.errors import ArtifactInputError
from zoo import assert_trees_close

RNG = np.random.default_rng()


def _normal(*shape):
    return jnp.asarray(RNG.standard_normal(shape), jnp.float32)


def _both(exp, tmp_path):
    """The artifact loaded in memory and from a saved folder."""
    return {"memory": jaxaot.export.load(exp), "disk": jaxaot.export.load(exp.save(tmp_path / "a"))}


SYMBOLIC_LOSSES = {
    "sum": (lambda x: jnp.sum(x), lambda b: (_normal(b),), ("b",)),
    "mean": (lambda x: jnp.mean(x), lambda b: (_normal(b),), ("b",)),
    "mean_matmul": (lambda w, x: jnp.mean(x @ w), lambda b: (_normal(3), _normal(b, 3)), (None, "b, 3")),
    "half_slice": (lambda x: jnp.sum(x[: x.shape[0] // 2] ** 2), lambda b: (_normal(b),), ("b",)),
    "compound": (lambda x, y: jnp.sum(x) * jnp.mean(y), lambda b: (_normal(b, 3), _normal(2 * b, 3)),
                 ("a, 3", "2*a, 3")),
    "while_loop": (lambda w, x: jnp.mean(jaxaot.loops.while_loop(
        lambda h: jnp.mean(h * h) > 0.01, lambda h: 0.5 * jnp.tanh(h @ w), x, max_steps=40) ** 2),
        lambda b: (0.3 * _normal(3, 3), _normal(b, 3)), (None, "b, 3")),
}


@pytest.mark.parametrize("name", sorted(SYMBOLIC_LOSSES))
def test_symbolic_dims_that_no_residual_carries(name, tmp_path):
    """The gradients' shapes need a dimension that neither cotangents nor residuals have: still one artifact."""
    fn, make, dyn = SYMBOLIC_LOSSES[name]
    argnums = tuple(range(len(make(4))))
    exp = jaxaot.export.export(fn, *make(4), dynamic_shapes=dyn)
    for where, f in _both(exp, tmp_path).items():
        for b in (2, 5, 8):
            args = make(b)
            got = jax.value_and_grad(f, argnums=argnums)(*args)
            want = jax.value_and_grad(fn, argnums=argnums)(*args)
            assert_trees_close(got, want, rtol=1e-5, atol=1e-5)
            y, res = f.forward(*args)
            ct = _normal()
            assert_trees_close(f.backward(res, ct), jax.vjp(fn, *args)[1](ct), rtol=1e-5, atol=1e-5)


def test_float64_artifact_loads_without_x64(tmp_path):
    """A float64 artifact loads in a process without x64; a call says to enable it, and runs once it is."""
    fn = lambda x: jnp.sum(jnp.sin(x) * x)
    x = RNG.standard_normal(5)
    with jax.enable_x64(True):
        path = jaxaot.export.export(fn, jnp.asarray(x)).save(tmp_path / "a")
        want = jax.value_and_grad(fn)(jnp.asarray(x))
    with jax.enable_x64(False):
        f = jaxaot.export.load(path)
        with pytest.raises(ArtifactInputError, match="jax_enable_x64"):
            f(jnp.asarray(x))
    with jax.enable_x64(True):
        got = jax.value_and_grad(f)(jnp.asarray(x))
        assert got[1].dtype == jnp.float64
        assert_trees_close(got, want, rtol=1e-12, atol=1e-12)


def _hessian_diag(f):
    return lambda x: jax.grad(lambda x: jnp.sum(jax.grad(f)(x) * x))(x)


@pytest.mark.parametrize("fn", [lambda x: jnp.sum(jnp.sin(x) ** 2), lambda x: jnp.sum(jnp.tanh(x) * x ** 3)])
def test_grad_of_grad_after_save(fn, tmp_path):
    """Second derivatives of a saved and loaded artifact are JAX's, as they are in memory."""
    exp = jaxaot.export.export(fn, jnp.ones(6))
    for where, f in _both(exp, tmp_path).items():
        x = _normal(6)
        assert_trees_close(_hessian_diag(f)(x), _hessian_diag(fn)(x), rtol=1e-4, atol=1e-4)
        assert_trees_close(jax.jit(_hessian_diag(f))(x), _hessian_diag(fn)(x), rtol=1e-4, atol=1e-4)


def test_third_derivative_after_save_names_the_limit(tmp_path):
    """Past the vjp programs a saved artifact holds, differentiating raises an ArtifactError naming the order."""
    fn = lambda x: jnp.sum(jnp.sin(x) ** 3)
    f = jaxaot.export.load(jaxaot.export.export(fn, jnp.ones(4)).save(tmp_path / "a"))
    third = lambda g: jax.grad(lambda x: jnp.sum(_hessian_diag(g)(x)))
    x = _normal(4)
    with pytest.raises(jaxaot.errors.ArtifactError, match="cannot be differentiated 3 times"):
        third(f)(x)
    assert_trees_close(third(jaxaot.export.load(jaxaot.export.export(fn, jnp.ones(4))))(x), third(fn)(x),
                       rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shapes, dyn, bad, match", [
    (((4, 3), (8, 3)), ("a, 3", "2*a, 3"), ((2, 3), (5, 3)), r"dimension '2\*a' is 5 here, but 4 for a=2 in arg\[0\]"),
    (((4, 3), (8, 3)), ("a, 3", "2*a, 3"), ((3, 3), (2, 3)), r"dimension '2\*a' is 2 here, but 6 for a=3"),
    (((6,),), ("2*a + 2",), ((5,),), r"no integer a >= 1"),
    (((3,), (9,)), ("a", "a*a"), ((3,), (10,)), r"dimension 'a\^2' is 10 here, but 9 for a=3"),
])
def test_compound_dims_that_do_not_fit_are_input_errors(shapes, dyn, bad, match, tmp_path):
    """A call whose sizes break a compound symbolic dim is an ArtifactInputError; calls that fit match JAX."""
    fn = lambda *xs: sum(jnp.sum(jnp.sin(x) * k) for k, x in enumerate(xs, 1))
    exp = jaxaot.export.export(fn, *(jnp.ones(s) for s in shapes), dynamic_shapes=dyn)
    argnums = tuple(range(len(shapes)))
    for where, f in _both(exp, tmp_path).items():
        with pytest.raises(ArtifactInputError, match=match):
            f(*(_normal(*s) for s in bad))
        args = [_normal(*s) for s in shapes]
        assert_trees_close(jax.value_and_grad(f, argnums=argnums)(*args),
                           jax.value_and_grad(fn, argnums=argnums)(*args), rtol=1e-5, atol=1e-5)


def test_constraints_of_symbolic_dims_are_checked_at_the_call(tmp_path):
    """A call whose sizes break a constraint the dims were exported with is an ArtifactInputError naming it;
    calls that meet it match JAX, after a save too."""
    fn = lambda x: jnp.sum(jnp.sin(x[:4]) ** 2)
    (b,) = jax.export.symbolic_shape("b", constraints=("b >= 4", "b <= 16"))
    exp = jaxaot.export.export(fn, jax.ShapeDtypeStruct((b, 3), jnp.float32))
    assert exp.signature.dim_constraints == ("b >= 4", "b <= 16")
    for where, f in _both(exp, tmp_path).items():
        for size, broken in ((2, "b >= 4"), (17, "b <= 16")):
            for call in (f, jax.grad(f)):
                with pytest.raises(ArtifactInputError, match=f"constraint '{broken}'.*b={size} in arg\\[0\\]"):
                    call(_normal(size, 3))
        x = _normal(int(RNG.integers(4, 17)), 3)
        assert_trees_close(jax.value_and_grad(f)(x), jax.value_and_grad(fn)(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scalar", [2.0, 3])
def test_dynamic_shapes_keep_python_numbers_weakly_typed(scalar, tmp_path):
    """A Python number beside symbolic dims stays weakly typed, as under jax.jit: a bf16 or int8 result stays so,
    its gradient is weak, and a strongly typed value for it is refused."""
    dtype = jnp.bfloat16 if isinstance(scalar, float) else jnp.int8
    x = jnp.asarray(RNG.integers(-3, 4, (5, 3)), dtype)
    fn = lambda x, s: x * s
    exp = jaxaot.export.export(fn, x, scalar, dynamic_shapes=("b, 3", None))
    assert exp.signature.in_specs[1].weak_type
    for where, f in _both(exp, tmp_path).items():
        y = jnp.asarray(RNG.integers(-3, 4, (7, 3)), dtype)
        got = f(y, scalar)
        assert got.dtype == jax.jit(fn)(y, scalar).dtype == dtype
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(fn(y, scalar), np.float32))
        with pytest.raises(ArtifactInputError):
            f(y, jnp.asarray(scalar, jnp.float32 if isinstance(scalar, float) else jnp.int32))
        if isinstance(scalar, float):
            g = jax.grad(lambda s: jnp.sum(f(y, s).astype(jnp.float32)))(scalar)
            want = jax.grad(lambda s: jnp.sum(fn(y, s).astype(jnp.float32)))(scalar)
            assert g.weak_type == want.weak_type and float(g) == pytest.approx(float(want), rel=1e-2)


def test_load_while_a_save_replaces_the_folder(tmp_path, monkeypatch):
    """A save that swaps another artifact in between the manifest and the programs: the load reads the new one."""
    from jaxaot._src.artifacts import manifest

    old_fn, new_fn = (lambda x: jnp.sum(jnp.sin(x))), (lambda x: jnp.sum(jnp.cos(x) * x))
    path = jaxaot.export.export(old_fn, jnp.ones(3)).save(tmp_path / "a")
    new = jaxaot.export.export(new_fn, jnp.ones(3))
    read_program, saves = manifest.load_program, []

    def racing(root, name, info, max_bytes=None):
        if not saves:
            saves.append(new.save(path))
        return read_program(root, name, info, max_bytes)

    monkeypatch.setattr(manifest, "load_program", racing)
    f = jaxaot.export.load(path)
    x = _normal(3)
    assert saves
    assert_trees_close(jax.value_and_grad(f)(x), jax.value_and_grad(new_fn)(x), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(manifest, "load_program", read_program)
    (path / "forward.jaxexport").write_bytes(b"damaged")
    with pytest.raises(jaxaot.errors.ArtifactError, match="forward"):
        jaxaot.export.load(path)


def test_grad_of_grad_through_a_while_loop_after_save(tmp_path):
    """A saved while_loop artifact: its gradient is JAX's; grad of grad is JAX's or an ArtifactError naming it."""
    def fn(w, x):
        _, h = jaxaot.loops.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, jnp.tanh(c[1] @ w)), (0, x),
                                       max_steps=8)
        return jnp.sum(h ** 2)

    f = jaxaot.export.load(jaxaot.export.export(fn, jnp.ones((4, 4)), jnp.ones((3, 4))).save(tmp_path / "a"))
    w, x = _normal(4, 4) / 2, _normal(3, 4)
    assert_trees_close(jax.value_and_grad(f)(w, x), jax.value_and_grad(fn)(w, x), rtol=1e-5, atol=1e-5)
    second = lambda g: jax.grad(lambda w: jnp.sum(jax.grad(g)(w, x) * w))(w)
    try:
        got = second(f)
    except jaxaot.errors.ArtifactError as err:
        assert "cannot be differentiated 2 times" in str(err)
    else:
        assert_trees_close(got, second(fn), rtol=1e-4, atol=1e-4)


def test_a_bounded_loop_exports_with_a_symbolic_batch():
    """A ``max_steps`` loop's stack has a symbolic row size: it exports as one stack, which runs at any size."""
    fn, make, dyn = SYMBOLIC_LOSSES["while_loop"]
    f = jaxaot.export.load(jaxaot.export.export(fn, *make(4), dynamic_shapes=dyn))
    args = make(int(RNG.integers(2, 9)))
    assert_trees_close(jax.value_and_grad(f, argnums=(0, 1))(*args), jax.value_and_grad(fn, argnums=(0, 1))(*args),
                       rtol=1e-5, atol=1e-5)
