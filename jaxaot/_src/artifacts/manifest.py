"""The saved form of an artifact: its directory layout, manifest schema, version policy and file reading.

An artifact is a folder: ``manifest.json``, one ``<program>.jaxexport`` per
program and, when signed, ``manifest.hmac``. A save writes a fresh folder and
swaps it in, so an interrupted save leaves the earlier artifact whole.
:func:`check_manifest` checks every field's type and the versions (format,
jaxaot's major version, a writer's jax and jaxlib no newer than the reader's)
before anything is used. Every file is read bounded and checked against its
recorded size and sha256, so a hostile artifact can neither run code, hang nor
exhaust memory (``docs/security.md``).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

import jax
import jaxlib

from jaxaot._src.files import (
    FileMismatchError, FileTooLargeError, UnsafeFileError, atomic_write, parse_json, read_regular, replace_folder,
)
from jaxaot._src.artifacts import audit, signing
from jaxaot._src.artifacts.treedef_json import MAX_DEPTH as MAX_TREE_DEPTH
from jaxaot.errors import ArtifactError, ArtifactVersionError, InvalidValueError

FORMAT = "jaxaot-export"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PROGRAMS = ("inference", "forward", "backward")
#: How many orders of vjp programs a saved forward and backward hold: grad of grad of a loaded artifact.
VJP_ORDER = 1
MIN_JAX = (0, 10)
#: The largest manifest ``load`` reads.
MAX_MANIFEST_BYTES = 64 << 20
#: The largest program file ``load`` reads (raise it, or pass ``load(..., max_bytes=...)``, for artifacts
#: with huge embedded constants).
MAX_PROGRAM_BYTES = 4 << 30
#: How deep the manifest's JSON may nest: a pytree structure nests two levels per pytree level.
MAX_MANIFEST_DEPTH = 2 * MAX_TREE_DEPTH + 16
_SHA256 = re.compile(r"[0-9a-f]{64}")
T = TypeVar("T")


def library_versions() -> dict:
    """The versions of jaxaot, jax and jaxlib in this process."""
    return {
        "jaxaot": getattr(sys.modules.get("jaxaot"), "__version__", "0"),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
    }


def write(root: Path, name: str, programs: Mapping[str, Any], signature_json: dict, key: bytes | None = None
          ) -> Path:
    """Write the serialized ``programs`` (``jax.export.Exported`` by name) and their manifest as the folder ``root``.

    Everything is written into a fresh folder beside ``root`` that then takes
    its place (:func:`~jaxaot._src.files.replace_folder`): an interrupted save leaves
    the earlier artifact at ``root`` whole and loadable. An existing ``root``
    must be empty or an artifact (:func:`is_artifact_file`). With ``key``, the
    manifest is signed (:mod:`~jaxaot._src.artifacts.signing`).
    """
    require_flatbuffers()
    files = {}
    artifacts, host = {}, False
    for program in PROGRAMS:
        exp = programs[program]
        blob, parts = serialize(program, exp, str(root))
        file = f"{program}.jaxexport"
        files[file] = blob
        ops = [audit.read_ops(what, part, str(root)) for what, part in parts.items()]
        host = host or any(audit.host_code(o) for o in ops)
        artifacts[program] = {
            "file": file,
            "sha256": hashlib.sha256(blob).hexdigest(),
            "bytes": len(blob),
            "platforms": list(exp.platforms),
            "calling_convention_version": int(exp.calling_convention_version),
            "custom_calls": sorted({c.target for o in ops for c in o.custom_calls}),
        }
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "versions": library_versions(),
        "function": name,
        "platforms": list(programs["forward"].platforms),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host_callbacks": host,
        "artifacts": artifacts,
        "signature": signature_json,
    }
    files[MANIFEST] = json.dumps(manifest, indent=1, sort_keys=True).encode()
    if key is not None:
        files[signing.SIGNATURE] = signing.sign(key, files[MANIFEST]).encode() + b"\n"

    def fill(folder: Path) -> None:
        for file, data in files.items():  # the manifest (and its tag) last
            atomic_write(folder / file, data, private=False)  # shared as the folder is: the umask decides

    try:
        return replace_folder(Path(root), fill, is_artifact_file)
    except FileExistsError as err:
        parent = next((p for p in Path(root).parents if p.exists()), None)
        why = (f"{parent} is a file, not a folder" if parent is not None and not parent.is_dir()
               else err.strerror)
        raise InvalidValueError(f"save: cannot write the artifact to {root}: {why}.") from None


def is_artifact_file(name: str) -> bool:
    """Whether a folder entry belongs to an artifact (a re-save may replace a folder holding only these)."""
    return name in (MANIFEST, signing.SIGNATURE) or name.endswith(".jaxexport") or (
        name.startswith(".") and name.endswith(".tmp"))


# --------------------------------------------------------------------------- reading files
def artifact_path(root: Path, what: str, file: Any) -> Path:
    """``root / file``, refusing names that could leave the artifact directory (and symlinks out of it).

    Example:
        >>> artifact_path(Path("/a"), "the forward program's file", "../../etc/passwd")
        Traceback (most recent call last):
        ...
        jaxaot.errors.ArtifactError: the forward program's file '../../etc/passwd' ...
    """
    if (not isinstance(file, str) or not file or file in (".", "..") or "/" in file or "\\" in file
            or "\0" in file or Path(file).is_absolute() or Path(file).name != file):
        raise ArtifactError(
            f"{what} {file!r} in {Path(root) / MANIFEST} is not a plain file name inside "
            "the artifact directory: refusing to load it (the manifest is corrupt or hostile)."
        )
    path = Path(root) / file
    if path.is_symlink():
        target = Path(os.path.realpath(path))
        if not target.is_relative_to(Path(os.path.realpath(root))):
            raise ArtifactError(f"{path} is a symlink out of the artifact directory: refusing to load it.")
        return target  # read without following links again (O_NOFOLLOW)
    return path


def read_file(path: Path, limit: int, what: str, limit_name: str, size: int | None = None,
              sha256: str | None = None) -> bytearray:
    """The bytes of an artifact file, through :func:`~jaxaot._src.files.read_regular`; every failure an ArtifactError.

    ``size`` and ``sha256`` (the manifest's) are checked as the file is opened
    and read: a file of another size is refused before a byte of it is read.
    """
    try:
        return read_regular(path, limit, size=size, sha256=sha256)
    except FileNotFoundError:
        raise ArtifactError(f"{what} {path} is missing.") from None
    except FileTooLargeError as err:
        raise ArtifactError(f"{err}: refusing to read it; {limit_name}={limit} (raise it, or pass "
                            "jaxaot.export.load(..., max_bytes=...), if you trust this artifact).") from None
    except FileMismatchError as err:
        raise ArtifactError(f"{err.path} is corrupt: it {err.why} by the manifest. Re-export or re-copy it.") from None
    except UnsafeFileError as err:
        raise ArtifactError(f"refusing to read {what}: {err}.") from None
    except OSError as err:
        raise ArtifactError(f"cannot read {what} {path}: {err}") from err


def read_manifest(root: Path, max_bytes: int | None = None, key: bytes | None = None) -> dict:
    """The parsed ``manifest.json`` of an artifact directory (a JSON object of the jaxaot format).

    With ``key``, its tag (``manifest.hmac``) is checked before the JSON is parsed.
    """
    root = Path(root)
    if not os.path.lexists(root / MANIFEST):
        raise ArtifactError(f"{root} is not a jaxaot export: it has no {MANIFEST}.")
    path = artifact_path(root, "the manifest", MANIFEST)
    limit = MAX_MANIFEST_BYTES if max_bytes is None else min(max_bytes, MAX_MANIFEST_BYTES)
    text = read_file(path, limit, "the manifest", "MAX_MANIFEST_BYTES")
    if key is not None:
        if not os.path.lexists(root / signing.SIGNATURE):
            raise ArtifactError(f"{root} is not signed (it has no {signing.SIGNATURE}), but a key was given: "
                                "refusing to load it. Load it without key= only if you trust its source.")
        tag = read_file(artifact_path(root, "the signature", signing.SIGNATURE), 256, "the signature", "256")
        signing.verify(key, text, tag, str(root / MANIFEST))
    try:
        manifest = parse_json(text, MAX_MANIFEST_DEPTH)
    except (ValueError, RecursionError) as err:
        raise ArtifactError(f"cannot read {path}: {type(err).__name__}: {err}") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{root / MANIFEST} is not a jaxaot export manifest (format != {FORMAT!r}).")
    return manifest


def serialize(name: str, exp: Any, where: str) -> tuple[bytes, dict[str, Any]]:
    """The file of program ``name`` and the programs in it by name (:func:`program_parts`).

    The forward and the backward take their vjp programs along (``VJP_ORDER``
    deep) where ``jax.export`` can make them and a load would take them (no host
    callbacks, custom calls of known types): ``jax.grad`` of ``jax.grad`` of a
    loaded artifact differentiates its backward, and a forward it runs for it.
    """
    if name != "inference" and exp.has_vjp():
        try:
            blob = bytes(exp.serialize(vjp_order=VJP_ORDER))
            parts = program_parts(name, jax.export.deserialize(blob))  # exp.vjp() would export the vjp again
            for what, part in list(parts.items())[1:]:
                audit.check_program(what, part, where, allow_callbacks=False)
            return blob, parts
        except Exception:  # a program jax cannot differentiate (a while loop), or a vjp a load refuses
            pass
    return bytes(exp.serialize()), {name: exp}


def program_parts(name: str, exp: Any) -> dict[str, Any]:
    """The deserialized ``exp`` and the vjp programs it holds, named as messages name them (``"backward's vjp"``)."""
    parts = {name: exp}
    while exp.has_vjp() and len(parts) <= VJP_ORDER:
        exp = exp.vjp()
        parts[name + "'s vjp" * len(parts)] = exp
    return parts


def retry_if_replaced(root: Path, read: Callable[[], T], attempts: int = 3) -> T:
    """``read()`` of the folder ``root``, again where it fails while a save puts another folder there.

    A save swaps a whole new folder in (:func:`write`); a load that read the
    manifest of one and a program of the other fails its size or checksum
    check, and reads the new folder whole on the next attempt.
    """
    for _ in range(attempts - 1):
        before = _folder_state(root)
        try:
            return read()
        except ArtifactError:
            if _folder_state(root) == before:
                raise
    return read()


def _folder_state(root: Path) -> tuple | None:
    """What changes when a save replaces the folder ``root`` (None where nothing is there)."""
    try:
        st = os.stat(root)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns


def load_program(root: Path, name: str, info: Mapping[str, Any], max_bytes: int | None = None) -> Any:
    """The ``jax.export.Exported`` of program ``name``, read and checked against its manifest entry."""
    path = artifact_path(root, f"the {name} program's file", info.get("file"))
    limit = MAX_PROGRAM_BYTES if max_bytes is None else max_bytes
    blob = read_file(path, limit, f"the {name} program", "MAX_PROGRAM_BYTES", size=info["bytes"],
                     sha256=info["sha256"])
    try:
        require_flatbuffers()
        exported = jax.export.deserialize(blob)
    except ImportError:
        raise
    except Exception as err:
        raise ArtifactError(f"jax.export cannot deserialize {path}: {type(err).__name__}: {err}") from err
    if int(exported.calling_convention_version) != info["calling_convention_version"]:
        raise ArtifactError(f"{path} uses calling convention {exported.calling_convention_version}, the manifest "
                            f"says {info['calling_convention_version']}: the file was altered or swapped.")
    return exported


# --------------------------------------------------------------------------- schema and versions
def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", str(v))[:3])


def check_manifest(manifest: Any, *, check_versions: bool = True) -> None:
    """Raise unless this process can load the manifest's programs: its format, schema and versions.

    Raises:
      ArtifactVersionError: another format version, jaxaot major version, a
        jax too old or too new, an unsupported calling convention.
      ArtifactError: a field of the wrong type, missing or out of place (the
        message names it).

    Example:
        >>> from jaxaot._src.artifacts.manifest import check_manifest
        >>> check_manifest({"format": "jaxaot-export", "format_version": 99})
        Traceback (most recent call last):
        ...
        jaxaot.errors.ArtifactVersionError: artifact format version 99 ...
        >>> check_manifest({"format": "jaxaot-export", "format_version": 1, "versions": []})
        Traceback (most recent call last):
        ...
        jaxaot.errors.ArtifactError: manifest field 'versions' is a list, not an object: the manifest is corrupt.
    """
    if not isinstance(manifest, Mapping):
        raise ArtifactError(f"the manifest is a {type(manifest).__name__}, not an object.")
    fv = manifest.get("format_version")
    if type(fv) is not int or fv != FORMAT_VERSION:
        newer = type(fv) is int and fv > FORMAT_VERSION
        raise ArtifactVersionError(
            f"artifact format version {fv!r} is not supported by this jaxaot (format {FORMAT_VERSION}): "
            + ("upgrade jaxaot to load it." if newer else "re-export it with this jaxaot.")
        )
    _check_schema(manifest)
    _check_versions(manifest, check_versions)


def _field(container: Mapping[str, Any], key: str, types: type | tuple, where: str = "", optional: bool = False
           ) -> Any:
    """``container[key]``, or an ArtifactError naming the field when it is missing or of another type."""
    name = f"{where}.{key}" if where else key
    if key not in container:
        if optional:
            return None
        raise ArtifactError(f"manifest field {name!r} is missing: the manifest is corrupt.")
    value = container[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        ok = False
    else:
        ok = isinstance(value, types)
    if not ok:
        want = " or ".join(_a(t) for t in (types if isinstance(types, tuple) else (types,)))
        raise ArtifactError(f"manifest field {name!r} is {_a(type(value))}, not {want}: the manifest is corrupt.")
    return value


_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", bool: "a boolean",
               type(None): "null", float: "a number"}


def _a(t: type) -> str:
    return _TYPE_NAMES.get(t, f"a {t.__name__}")


def _check_schema(m: Mapping[str, Any]) -> None:
    versions = _field(m, "versions", dict)
    for lib in ("jaxaot", "jax"):
        _field(versions, lib, str, "versions")
    _field(versions, "jaxlib", str, "versions", optional=True)
    _field(m, "function", str, optional=True)
    platforms = _field(m, "platforms", list, optional=True) or []
    if not all(isinstance(p, str) for p in platforms):
        raise ArtifactError("manifest field 'platforms' must list platform names (strings).")
    _field(m, "host_callbacks", bool, optional=True)
    artifacts = _field(m, "artifacts", dict)
    if set(artifacts) != set(PROGRAMS):
        raise ArtifactError(f"manifest field 'artifacts' names the programs {sorted(artifacts)}, not "
                            f"{list(PROGRAMS)}: the manifest is corrupt.")
    for name in PROGRAMS:
        info = _field(artifacts, name, dict, "artifacts")
        where = f"artifacts.{name}"
        _field(info, "file", str, where)
        if not _SHA256.fullmatch(_field(info, "sha256", str, where)):
            raise ArtifactError(f"manifest field '{where}.sha256' is not a sha256 in hex: the manifest is corrupt.")
        if _field(info, "bytes", int, where) < 0:
            raise ArtifactError(f"manifest field '{where}.bytes' is negative: the manifest is corrupt.")
        _field(info, "calling_convention_version", int, where)
        for key in ("platforms", "custom_calls"):
            entries = _field(info, key, list, where, optional=True) or []
            if not all(isinstance(p, str) for p in entries):
                raise ArtifactError(f"manifest field '{where}.{key}' must list strings: the manifest is corrupt.")
    _field(m, "signature", dict)


def _check_versions(manifest: Mapping[str, Any], check_versions: bool) -> None:
    versions = manifest["versions"]
    ours = library_versions()
    writer = _version_tuple(versions["jaxaot"])
    if not writer or writer[0] != _version_tuple(ours["jaxaot"])[0]:
        raise ArtifactVersionError(
            f"artifact written by jaxaot {versions['jaxaot']}, incompatible with this jaxaot "
            f"{ours['jaxaot']} (major versions differ): re-export it with this jaxaot."
        )
    if not check_versions:
        return
    wjax, rjax = _version_tuple(versions["jax"])[:2], _version_tuple(jax.__version__)[:2]
    if len(wjax) < 2 or wjax < MIN_JAX:
        raise ArtifactVersionError(
            f"artifact written by jax {versions['jax']}; jaxaot artifacts need jax >= "
            f"{'.'.join(map(str, MIN_JAX))}: re-export it."
        )
    if wjax > rjax:
        raise ArtifactVersionError(
            f"artifact written by jax {versions['jax']}, newer than this process's jax {jax.__version__}: "
            "jax.export guarantees only that newer jax loads older artifacts. Upgrade jax here, re-export "
            "with the older jax, or pass check_versions=False to try anyway."
        )
    if "jaxlib" in versions:
        wlib, rlib = _version_tuple(versions["jaxlib"])[:2], _version_tuple(jaxlib.__version__)[:2]
        if len(wlib) < 2 or wlib < MIN_JAX or wlib > rlib:
            why = ("not a version to compare with this process's" if len(wlib) < 2 else
                   "newer than this process's" if wlib > rlib else
                   f"older than any jaxaot artifact's ({'.'.join(map(str, MIN_JAX))}), unlike this process's")
            raise ArtifactVersionError(
                f"artifact written with jaxlib {versions['jaxlib']}, {why} jaxlib {jaxlib.__version__}: its "
                "programs' kernels (custom calls) are guaranteed to load only into the jaxlib that wrote them or a "
                "newer one. Upgrade jaxlib here, re-export it, or pass check_versions=False to try anyway."
            )
    lo, hi = jax.export.minimum_supported_calling_convention_version, jax.export.maximum_supported_calling_convention_version
    for name, info in manifest["artifacts"].items():
        ccv = info["calling_convention_version"]
        if not lo <= ccv <= hi:
            raise ArtifactVersionError(
                f"the {name} program uses jax.export calling convention {ccv}; jax {jax.__version__} "
                f"supports {lo}..{hi}: re-export it with a jax that this one can load."
            )


def require_flatbuffers() -> None:
    """jax.export's (de)serialization needs the ``flatbuffers`` package, an extra of jaxaot."""
    try:
        import flatbuffers  # noqa: F401
    except ImportError:
        raise ImportError(
            "saving or loading jaxaot artifacts needs the 'flatbuffers' package, which jax.export uses "
            "for its serialized format: pip install 'jaxaot[export]' (or pip install flatbuffers)."
        ) from None
