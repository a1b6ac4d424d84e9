"""The saved form of an artifact: its directory layout, manifest and version policy.

Layout (``ExportedAOT.save``)::

    manifest.json           # see below
    inference.jaxexport     # Exported.serialize() of each program
    forward.jaxexport
    backward.jaxexport

``manifest.json`` holds ``format: "jaxaot-export"``, ``format_version``, the
``versions`` (jaxaot, jax, jaxlib) that wrote it, ``function``, ``platforms``,
``artifacts`` (per program: file, sha256, bytes, platforms, calling convention
version) and ``signature`` (:meth:`~jaxaot.artifacts.signature.AOTSignature.to_json`).
Files are written atomically, the manifest last.

Version policy (:func:`check_manifest`): the format version must match; the
jaxaot major version must match; the writer's jax must be at least 0.10 and not
newer (major.minor) than the reader's (``jax.export`` guarantees only that newer
jax loads older artifacts); each program's calling convention version must be
supported by the reader's jax. ``load(..., check_versions=False)`` skips the jax
checks (not the format check).

Loading a hostile artifact can neither run code nor exhaust memory: the
manifest is JSON (at most :data:`MAX_MANIFEST_BYTES`), program files must be
plain names inside the artifact directory (no ``..``, no absolute paths, no
symlinks out of it) of at most :data:`MAX_PROGRAM_BYTES` whose size and sha256
match the manifest, and the signature's shapes, indices and pytree depth are
bounded (:meth:`~jaxaot.artifacts.signature.AOTSignature.validate`).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any, Mapping

import jax
import jaxlib

from jaxaot._files import atomic_write
from jaxaot.errors import ArtifactError, ArtifactVersionError

FORMAT = "jaxaot-export"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PROGRAMS = ("inference", "forward", "backward")
MIN_JAX = (0, 10)
#: The largest manifest ``load`` reads.
MAX_MANIFEST_BYTES = 64 << 20
#: The largest program file ``load`` reads (raise it for artifacts with huge embedded constants).
MAX_PROGRAM_BYTES = 4 << 30


def library_versions() -> dict:
    """The versions of jaxaot, jax and jaxlib in this process."""
    return {
        "jaxaot": getattr(sys.modules.get("jaxaot"), "__version__", "0"),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
    }


def write(root: Path, name: str, programs: Mapping[str, Any], signature_json: dict) -> Path:
    """Write the serialized ``programs`` (``jax.export.Exported`` by name) and their manifest into ``root``."""
    require_flatbuffers()
    root.mkdir(parents=True, exist_ok=True)
    artifacts = {}
    for program in PROGRAMS:
        exp = programs[program]
        blob = bytes(exp.serialize())
        file = f"{program}.jaxexport"
        atomic_write(root / file, blob)
        artifacts[program] = {
            "file": file,
            "sha256": hashlib.sha256(blob).hexdigest(),
            "bytes": len(blob),
            "platforms": list(exp.platforms),
            "calling_convention_version": int(exp.calling_convention_version),
        }
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "versions": library_versions(),
        "function": name,
        "platforms": list(programs["forward"].platforms),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "artifacts": artifacts,
        "signature": signature_json,
    }
    atomic_write(root / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    return root


def read_manifest(root: Path) -> dict:
    """The parsed ``manifest.json`` of an artifact directory."""
    path = Path(root) / MANIFEST
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_MANIFEST_BYTES + 1)
        if len(text) > MAX_MANIFEST_BYTES:
            raise ArtifactError(f"{path} is larger than {MAX_MANIFEST_BYTES} bytes: not a jaxaot manifest.")
        manifest = json.loads(text)
    except FileNotFoundError:
        raise ArtifactError(f"{root} is not a jaxaot export: it has no {MANIFEST}.") from None
    except (OSError, ValueError, RecursionError) as err:
        raise ArtifactError(f"cannot read {path}: {type(err).__name__}: {err}") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{Path(root) / MANIFEST} is not a jaxaot export manifest (format != {FORMAT!r}).")
    return manifest


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", str(v))[:3])


def check_manifest(manifest: Mapping[str, Any], *, check_versions: bool = True) -> None:
    """Raise :class:`ArtifactVersionError` if this process cannot load the manifest's programs.

    Example:
        >>> from jaxaot.artifacts.manifest import check_manifest
        >>> check_manifest({"format": "jaxaot-export", "format_version": 99})
        Traceback (most recent call last):
        ...
        jaxaot.errors.ArtifactVersionError: artifact format version 99 ...
    """
    fv = manifest.get("format_version")
    if fv != FORMAT_VERSION:
        newer = isinstance(fv, int) and fv > FORMAT_VERSION
        raise ArtifactVersionError(
            f"artifact format version {fv} is not supported by this jaxaot (format {FORMAT_VERSION}): "
            + ("upgrade jaxaot to load it." if newer else "re-export it with this jaxaot.")
        )
    versions = manifest.get("versions", {})
    ours = library_versions()
    writer = _version_tuple(versions.get("jaxaot", "?"))
    if not writer or writer[0] != _version_tuple(ours["jaxaot"])[0]:
        raise ArtifactVersionError(
            f"artifact written by jaxaot {versions.get('jaxaot')}, incompatible with this jaxaot "
            f"{ours['jaxaot']} (major versions differ): re-export it with this jaxaot."
        )
    if not check_versions:
        return
    wjax, rjax = _version_tuple(versions.get("jax", "?"))[:2], _version_tuple(jax.__version__)[:2]
    if len(wjax) < 2 or wjax < MIN_JAX:
        raise ArtifactVersionError(
            f"artifact written by jax {versions.get('jax')}; jaxaot artifacts need jax >= "
            f"{'.'.join(map(str, MIN_JAX))}: re-export it."
        )
    if wjax > rjax:
        raise ArtifactVersionError(
            f"artifact written by jax {versions.get('jax')}, newer than this process's jax {jax.__version__}: "
            "jax.export guarantees only that newer jax loads older artifacts. Upgrade jax here, re-export "
            "with the older jax, or pass check_versions=False to try anyway."
        )
    lo, hi = jax.export.minimum_supported_calling_convention_version, jax.export.maximum_supported_calling_convention_version
    for name, info in manifest.get("artifacts", {}).items():
        ccv = info.get("calling_convention_version")
        if not isinstance(ccv, int) or not lo <= ccv <= hi:
            raise ArtifactVersionError(
                f"the {name} program uses jax.export calling convention {ccv}; jax {jax.__version__} "
                f"supports {lo}..{hi}: re-export it with a jax that this one can load."
            )


def program_path(root: Path, name: str, file: Any) -> Path:
    """``root / file``, refusing names that could leave the artifact directory.

    Example:
        >>> program_path(Path("/a"), "forward", "../../etc/passwd")
        Traceback (most recent call last):
        ...
        jaxaot.errors.ArtifactError: the forward program's file '../../etc/passwd' ...
    """
    if (not isinstance(file, str) or not file or file in (".", "..") or "/" in file or "\\" in file
            or "\0" in file or Path(file).is_absolute() or Path(file).name != file):
        raise ArtifactError(
            f"the {name} program's file {file!r} in {Path(root) / MANIFEST} is not a plain file name inside "
            "the artifact directory: refusing to load it (the manifest is corrupt or hostile)."
        )
    path = Path(root) / file
    if path.is_symlink() and not path.resolve().is_relative_to(Path(root).resolve()):
        raise ArtifactError(f"{path} is a symlink out of the artifact directory: refusing to load it.")
    return path


def load_program(root: Path, name: str, info: Mapping[str, Any]) -> Any:
    path = program_path(root, name, info.get("file"))
    declared = info.get("bytes")
    try:
        size = path.stat().st_size
        if size > MAX_PROGRAM_BYTES:
            raise ArtifactError(
                f"{path} is {size} bytes, more than jaxaot.artifacts.manifest.MAX_PROGRAM_BYTES="
                f"{MAX_PROGRAM_BYTES}: refusing to read it (raise the limit if you trust this artifact)."
            )
        if isinstance(declared, int) and declared != size:
            raise ArtifactError(f"{path} is corrupt: it has {size} bytes, the manifest says {declared}.")
        with open(path, "rb") as f:
            blob = f.read(MAX_PROGRAM_BYTES + 1)
    except OSError as err:
        raise ArtifactError(f"cannot read the {name} program {path}: {err}") from err
    if hashlib.sha256(blob).hexdigest() != info.get("sha256"):
        raise ArtifactError(f"{path} is corrupt: its sha256 differs from the manifest's. Re-export or re-copy it.")
    try:
        require_flatbuffers()
        return jax.export.deserialize(bytearray(blob))
    except Exception as err:
        raise ArtifactError(f"jax.export cannot deserialize {path}: {type(err).__name__}: {err}") from err


def require_flatbuffers() -> None:
    """jax.export's (de)serialization needs the ``flatbuffers`` package, an extra of jaxaot."""
    try:
        import flatbuffers  # noqa: F401
    except ImportError:
        raise ImportError(
            "saving or loading jaxaot artifacts needs the 'flatbuffers' package, which jax.export uses "
            "for its serialized format: pip install 'jaxaot[export]' (or pip install flatbuffers)."
        ) from None
