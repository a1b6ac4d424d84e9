"""Export the split programs with ``jax.export`` and load them without the source.

Modules, each one concept: ``treedef_json`` (pytree structures as JSON),
``mesh_spec`` (a sharded artifact's mesh, partition specs and device-count
checks), ``aot_signature`` (the calling contract: array specs, residual wiring,
run-time checks), ``manifest`` (the directory layout, schema, version policy and safe
file reading), ``audit`` (what a loaded program may call and must take), ``dims``
(symbolic dimensions that are expressions, checked at a call), ``program_calls``
(calls differentiable as deep as the saved vjp programs),
``exported`` (:class:`ExportedAOT`, in memory), ``loaded`` (:func:`load`,
:class:`LoadedAOT`), ``call_log`` (its ``cache_info``), ``weak_types`` (the weak
types ``jax.export`` drops) and ``exporting`` (:func:`export`, the driver).
"""

from jaxaot._src.artifacts.treedef_json import treedef_from_json, treedef_to_json
from jaxaot._src.artifacts.mesh_spec import MeshSpec
from jaxaot._src.artifacts.aot_signature import AOTSignature, ArraySpec, RuntimeCheck
from jaxaot._src.artifacts.manifest import check_manifest, is_artifact_file, read_manifest
from jaxaot._src.artifacts.exported import ExportedAOT
from jaxaot._src.artifacts.loaded import ExportedResiduals, LoadedAOT, load
from jaxaot._src.artifacts.exporting import export

__all__ = [
    "AOTSignature", "ArraySpec", "ExportedAOT", "ExportedResiduals", "LoadedAOT", "MeshSpec", "RuntimeCheck",
    "check_manifest", "export", "is_artifact_file", "load", "read_manifest", "treedef_from_json", "treedef_to_json",
]
