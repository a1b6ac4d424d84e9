"""jaxaot.export / jaxaot.export.load of functions called with sharded inputs.

Each case exports an ``aot_function`` called with arrays on a ``(data=N/2, model=2)``
mesh (``Auto`` or ``Explicit`` axes), serializes it (to a directory, or each
program to bytes), loads it in process and checks: the recorded shardings
and device count, gradients against ``jax.jit(jax.value_and_grad(f))`` on the
same inputs, and that outputs, residuals and gradients come back with the
exported shardings. A program exported for N devices refuses arrays on N/2 (or
on one), and a process with N/2 devices refuses to load it. ``N`` is the largest
of 2, 4 and 8 that the backend has: 8 CPU devices from tests/conftest.py, or the
GPUs; with one device there is no sharded export to test and the module skips.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import textwrap
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxaot
from jaxaot._src.artifacts import ExportedAOT, LoadedAOT, MeshSpec
from jaxaot.errors import ArtifactError, NotExportableError
from zoo import assert_trees_close, child_env

N = max(n for n in (1, 2, 4, 8) if n <= jax.device_count())  # the exporting mesh's devices
HALF = N // 2  # its "data" axis, and the smaller device count that calls and loads are refused on
pytestmark = pytest.mark.skipif(N < 2, reason="a sharded export needs a mesh of two or more devices")

TOL = dict(rtol=2e-5, atol=2e-5)


# --------------------------------------------------------------------------- models
def _dp_loss(out_sharding: Any) -> Callable:
    """A data-parallel MLP: replicated params, batch split over 'data'."""
    del out_sharding

    def dp_loss(params, x, y):
        h = jax.nn.gelu(x @ params["w1"] + params["b1"])
        return jnp.mean((h @ params["w2"] - y) ** 2)

    return dp_loss


def _megatron_loss(out_sharding: Any) -> Callable:
    """A Megatron MLP: w1 split by columns and w2 by rows over 'model', batch over 'data'.

    Under explicit axes the second matmul contracts a sharded dim: JAX asks for its output sharding.
    """
    def megatron_loss(params, x, y):
        h = jnp.tanh(x @ params["w1"])
        out = jnp.matmul(h, params["w2"], out_sharding=out_sharding) if out_sharding is not None else h @ params["w2"]
        return jnp.mean((out - y) ** 2)

    return megatron_loss


MODELS = {
    "dp": (_dp_loss, {"w1": P(), "b1": P(), "w2": P()}),
    "megatron": (_megatron_loss, {"w1": P(None, "model"), "w2": P("model", None)}),
}
SHAPES = {"w1": (16, 32), "b1": (32,), "w2": (32, 8)}


@dataclasses.dataclass
class Case:
    mesh: Any
    loss: Callable
    aot: Any  # the aot_function that was exported
    args: tuple
    exported: ExportedAOT
    loaded: LoadedAOT

    def context(self):
        """JAX's eager grad under explicit axes needs the mesh set (jax.set_mesh), as for plain JAX."""
        explicit = AxisType.Explicit in self.mesh.axis_types
        return jax.set_mesh(self.mesh) if explicit else contextlib.nullcontext()


def _mesh(axis: AxisType) -> jax.sharding.Mesh:
    return jax.make_mesh((HALF, 2), ("data", "model"), axis_types=(axis, axis), devices=jax.devices()[:N])


def _args(mesh, specs: dict, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    params = {k: put(rng.standard_normal(SHAPES[k], dtype=np.float32) / np.float32(4), spec)
              for k, spec in specs.items()}
    x = put(rng.standard_normal((16, 16), dtype=np.float32), P("data", None))
    y = put(rng.standard_normal((16, 8), dtype=np.float32), P("data", None))
    return params, x, y


def _reload(exp: ExportedAOT, how: str, tmp: Any) -> LoadedAOT:
    """Serialize ``exp`` (a directory, or each program to bytes) and load it back."""
    if how == "dir":
        return jaxaot.export.load(exp.save(tmp / "artifact"))
    programs = {p: jax.export.deserialize(bytearray(getattr(exp, p).serialize()))
                for p in ("inference", "forward", "backward")}
    return jaxaot.export.load(ExportedAOT(signature=exp.signature, name=exp.name, **programs))


_CASES: dict[tuple, Case] = {}


def _case(model: str, axis: AxisType, how: str, tmp_path_factory: Any) -> Case:
    """The exported and reloaded case, built once per module run."""
    key = (model, axis, how)
    if key not in _CASES:
        _CASES[key] = _build(model, axis, how, tmp_path_factory.mktemp(f"{model}_{axis.name}_{how}"))
    return _CASES[key]


def _build(model: str, axis: AxisType, how: str, tmp: Any) -> Case:
    make, specs = MODELS[model]
    mesh = _mesh(axis)
    loss = make(NamedSharding(mesh, P("data", None)) if axis == AxisType.Explicit else None)
    # the Megatron MLP under the min-cut partitioner, the data-parallel one under the default
    options = {} if model == "dp" else {"partition_fn": jaxaot.partition.min_cut_rematerialization_partition}
    aot = jaxaot.aot_function(loss, **options)
    args = _args(mesh, specs)
    exp = jaxaot.export.export(aot, *args)
    return Case(mesh, loss, aot, args, exp, _reload(exp, how, tmp))


CASES = [("dp", AxisType.Auto, "dir"), ("megatron", AxisType.Auto, "bytes"),
         ("dp", AxisType.Explicit, "bytes"), ("megatron", AxisType.Explicit, "dir")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-{a.name.lower()}-{h}" for m, a, h in CASES])
def case(request, tmp_path_factory) -> Case:
    return _case(*request.param, tmp_path_factory)


def _equivalent(x: jax.Array, sharding: Any) -> bool:
    return x.sharding.is_equivalent_to(sharding, x.ndim)


def _named(mesh, spec: tuple | None) -> NamedSharding:
    return NamedSharding(mesh, P(*(spec or ())))


# --------------------------------------------------------------------------- what is recorded
def test_records_device_count_mesh_and_shardings(case):
    exp, s = case.exported, case.exported.signature
    assert [exp.inference.nr_devices, exp.forward.nr_devices, exp.backward.nr_devices] == [N, N, N]
    axis = case.mesh.axis_types[0].name
    assert s.mesh == MeshSpec(("data", "model"), (HALF, 2), (axis, axis)) and s.mesh.num_devices == N
    assert case.loaded.num_devices == N
    leaves = jax.tree_util.tree_leaves(case.args)
    for spec, x in zip(s.in_specs, leaves):
        assert _equivalent(x, _named(case.mesh, spec.sharding)), (spec, x.sharding)
    # The residuals are exported in the shardings the runtime's compiled forward gives them.
    _, res = case.aot.forward(*case.args)
    assert len(res.arrays) == len(s.residual_specs)
    for spec, r in zip(s.residual_specs, res.arrays):
        assert spec.shape == r.shape and _equivalent(r, _named(case.mesh, spec.sharding)), (spec, r.sharding)
    assert [tuple(a.shape) for a in exp.backward.in_avals[len(s.cotangent_outputs):]] == [
        r.shape for r in s.residual_specs]


# --------------------------------------------------------------------------- running the loaded artifact
def test_gradients_match_jit_and_keep_shardings(case):
    params, x, y = case.args
    with case.context():
        want = jax.jit(jax.value_and_grad(case.loss))(params, x, y)
        got = jax.value_and_grad(case.loaded)(params, x, y)
        jitted = jax.jit(jax.value_and_grad(case.loaded))(params, x, y)
    assert_trees_close(got, want, **TOL)
    assert_trees_close(jitted, want, **TOL)
    for g, p in zip(jax.tree_util.tree_leaves((got[1], jitted[1])), jax.tree_util.tree_leaves((params, params))):
        assert _equivalent(g, p.sharding), (g.sharding, p.sharding)
    out_spec = case.exported.signature.out_specs[0]
    assert _equivalent(got[0], _named(case.mesh, out_spec.sharding))


def test_explicit_split_keeps_residual_shardings(case):
    params, x, y = case.args
    with case.context():
        want = jax.jit(jax.value_and_grad(case.loss, argnums=(0, 1, 2)))(params, x, y)
        out, res = case.loaded.forward(params, x, y)
        grads = case.loaded.backward(res, jnp.float32(1))
        _, runtime_res = case.aot.forward(params, x, y)
    assert_trees_close((out, grads), want, **TOL)
    for r, rr in zip(res.arrays, runtime_res.arrays):  # the same residuals, placed the same way
        assert r.shape == rr.shape and _equivalent(r, rr.sharding), (r.sharding, rr.sharding)
        np.testing.assert_allclose(np.asarray(r), np.asarray(rr), **TOL)
    for g, a in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(case.args)):
        assert _equivalent(g, a.sharding), (g.sharding, a.sharding)


def test_placement_helpers_put_host_arrays_where_the_export_had_them(case):
    mesh = case.loaded.mesh()
    assert dict(mesh.shape) == {"data": HALF, "model": 2} and mesh.axis_types == case.mesh.axis_types
    shardings = case.loaded.in_shardings(mesh)
    host = jax.device_get(case.args)
    placed = jax.device_put(host, shardings)
    for a, b in zip(jax.tree_util.tree_leaves(placed), jax.tree_util.tree_leaves(case.args)):
        assert _equivalent(a, b.sharding)
    with case.context():
        np.testing.assert_allclose(case.loaded(*placed), case.loss(*case.args), **TOL)


# --------------------------------------------------------------------------- device counts
def _dp_auto(tmp_path_factory) -> Case:
    return _case("dp", AxisType.Auto, "dir", tmp_path_factory)


@pytest.mark.skipif(N < 4, reason="needs a second mesh of two or more devices, half the exporting mesh")
def test_call_on_another_device_count_names_both_counts(tmp_path_factory):
    c = _dp_auto(tmp_path_factory)
    smaller = jax.make_mesh((HALF,), ("data",), axis_types=(AxisType.Auto,), devices=jax.devices()[:HALF])
    on_half = jax.device_put(c.args, NamedSharding(smaller, P()))
    with pytest.raises(ArtifactError, match=rf"exported for {N} devices \(mesh data={HALF} x model=2\), but its "
                                            rf"inputs are on {HALF} devices.*f\.in_shardings\(mesh\).*re-export .* "
                                            rf"mesh of {HALF} devices"):
        c.loaded(*on_half)
    with pytest.raises(ArtifactError, match=rf"forward program .* {N} devices.* on {HALF} devices"):
        jax.grad(c.loaded)(*on_half)


def test_call_with_uncommitted_inputs_names_one_device(tmp_path_factory):
    c = _dp_auto(tmp_path_factory)
    with pytest.raises(ArtifactError, match=rf"{N} devices .* on one device \(no input is committed"):
        c.loaded.forward(*jax.device_get(c.args))


def test_uncommitted_inputs_under_the_mesh_context_run_on_its_devices():
    """Under ``jax.set_mesh``, uncommitted inputs run where ``jax.export``'s own call places them: on the mesh."""
    mesh = jax.make_mesh((N,), ("data",), axis_types=(AxisType.Auto,), devices=jax.devices()[:N])

    def loss(w, x):
        return jnp.sum(jnp.tanh(jax.lax.with_sharding_constraint(x, P("data")) @ w))

    k = jax.random.split(jax.random.key(np.random.default_rng().integers(1 << 30)), 2)
    w, x = jax.random.normal(k[0], (4, 2)) / 2, jax.random.normal(k[1], (2 * N, 4))
    with jax.set_mesh(mesh):
        loaded = jaxaot.export.load(jaxaot.export.export(loss, w, x))
        assert_trees_close(loaded(w, x), jax.jit(loss)(w, x), rtol=1e-5, atol=1e-5)
        assert_trees_close(jax.grad(loaded, argnums=(0, 1))(w, x), jax.jit(jax.grad(loss, argnums=(0, 1)))(w, x),
                           rtol=1e-5, atol=1e-5)


_LOAD_WITH_FEWER_DEVICES = textwrap.dedent(
    """
    import sys
    import jax, jaxaot
    assert jax.device_count() == int(sys.argv[2]), jax.device_count()
    try:
        jaxaot.export.load(sys.argv[1])
    except jaxaot.errors.ArtifactError as e:
        print("REFUSED:", e)
    """
)


def test_load_with_fewer_devices_is_refused_in_a_fresh_process(tmp_path_factory, tmp_path):
    directory = _dp_auto(tmp_path_factory).exported.save(tmp_path / "a")
    # The child runs on HALF host CPUs (on a GPU machine too): it refuses the artifact before reading its platform.
    env = dict(child_env(), XLA_FLAGS=f"--xla_force_host_platform_device_count={HALF}", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _LOAD_WITH_FEWER_DEVICES, str(directory), str(HALF)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    message = proc.stdout
    assert "REFUSED:" in message, message
    devices = "cpu devices" if HALF > 1 else "cpu device:"
    assert f"exported for {N} devices (mesh data={HALF} x model=2)" in message, message
    assert f"this process has {HALF} {devices}" in message, message
    assert f"xla_force_host_platform_device_count={N}" in message, message
    assert f"re-export it on a mesh of {HALF} devices" in message, message


# --------------------------------------------------------------------------- the manifest
def test_manifest_records_mesh_and_partition_specs(tmp_path_factory, tmp_path):
    directory = _dp_auto(tmp_path_factory).exported.save(tmp_path / "a")
    manifest = json.loads((directory / "manifest.json").read_text())
    sig = manifest["signature"]
    assert sig["mesh"] == {"axis_names": ["data", "model"], "axis_sizes": [HALF, 2], "axis_types": ["Auto", "Auto"]}
    assert [s.get("sharding") for s in sig["in_specs"]] == [[], [], [], ["data", None], ["data", None]]
    sig["mesh"]["axis_sizes"] = [HALF, -2]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"mesh axis 'model' has size -2"):
        jaxaot.export.load(directory)
    sig["mesh"]["axis_sizes"] = [HALF, 2]
    sig["in_specs"][0]["sharding"] = [{"not": "an axis"}]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"partition spec entry"):
        jaxaot.export.load(directory)


def test_unsharded_artifact_records_no_mesh_and_runs_on_sharded_inputs(tmp_path_factory):
    c = _dp_auto(tmp_path_factory)
    host = jax.device_get(c.args)
    exp = jaxaot.export.export(c.loss, *host)
    assert exp.forward.nr_devices == 1 and exp.signature.mesh is None
    assert all(s.sharding is None and "sharding" not in s.to_json() for s in exp.signature.in_specs)
    assert "mesh" not in exp.signature.to_json()
    f = jaxaot.export.load(exp)
    with pytest.raises(ArtifactError, match="exported from unsharded inputs"):
        f.mesh()
    assert_trees_close(jax.grad(f)(*c.args), jax.grad(c.loss)(*host), **TOL)  # one-device programs run anywhere


def test_sharded_inputs_with_dynamic_shapes_are_refused(tmp_path_factory):
    c = _dp_auto(tmp_path_factory)
    with pytest.raises(NotExportableError, match=r"sharded inputs and symbolic dimensions"):
        jaxaot.export.export(c.loss, *c.args, dynamic_shapes=(None, "b, ...", "b, ..."))


def test_replicated_residual_policy_carries_into_the_export(tmp_path_factory):
    c = _dp_auto(tmp_path_factory)
    exp = jaxaot.export.export(jaxaot.aot_function(c.loss, residual_sharding="replicated"), *c.args)
    s = exp.signature
    temporaries = [spec for spec, i in zip(s.residual_specs[len(s.saved_inputs):], s.saved_outputs)
                   if i >= s.num_outputs]
    assert temporaries and all(not any(spec.sharding or ()) for spec in temporaries)
    # The default policy keeps the batch-split temporaries split (on two devices "data" has one: nothing splits).
    producer = c.exported.signature
    assert HALF == 1 or any(any(spec.sharding or ()) for spec in producer.residual_specs[len(producer.saved_inputs):])
    assert_trees_close(jax.grad(jaxaot.export.load(exp))(*c.args), jax.grad(c.loss)(*c.args), **TOL)
