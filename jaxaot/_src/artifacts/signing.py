"""Signed artifacts: an HMAC binds the manifest, and through its checksums the programs, to a key.

``save(path, key=k)`` writes ``manifest.hmac``, HMAC-SHA256 under ``k`` of the
manifest's exact bytes (which hold each program's sha256). ``load(path, key=k)``
checks it before parsing the manifest, so any edit, a swapped program or another
key is refused. Without ``key``, loading trusts the artifact's source
(``docs/security.md``).

Example:
    >>> tag = sign(b"k" * 32, b'{"format": "jaxaot-export"}')
    >>> verify(b"k" * 32, b'{"format": "jaxaot-export"}', tag.encode(), "manifest.json")
    >>> verify(b"k" * 32, b'{"format": "jaxaot-export "}', tag.encode(), "manifest.json")
    Traceback (most recent call last):
    ...
    jaxaot.errors.ArtifactError: manifest.json does not match its signature ...
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from jaxaot.errors import ArtifactError, InvalidInputError, InvalidValueError

#: The file beside the manifest holding its tag (hex).
SIGNATURE = "manifest.hmac"
#: The shortest key accepted, in bytes.
MIN_KEY_BYTES = 16
_DOMAIN = b"jaxaot-artifact-manifest-v1\0"


def check_key(fn: str, key: Any) -> bytes | None:
    """``key`` as bytes (None stays None), or the typed error naming ``fn``: bytes of at least 16."""
    if key is None:
        return None
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise InvalidInputError(f"{fn}: key must be bytes (a secret of at least {MIN_KEY_BYTES} bytes, such as "
                                f"secrets.token_bytes(32)) or None, got {type(key).__name__}.")
    key = bytes(key)
    if len(key) < MIN_KEY_BYTES:
        raise InvalidValueError(f"{fn}: key has {len(key)} bytes; use at least {MIN_KEY_BYTES} random bytes "
                                "(secrets.token_bytes(32)).")
    return key


def sign(key: bytes, manifest: bytes | bytearray) -> str:
    """The tag of a manifest's bytes under ``key`` (hex)."""
    return hmac.new(key, _DOMAIN + bytes(manifest), hashlib.sha256).hexdigest()


def verify(key: bytes, manifest: bytes | bytearray, tag: bytes | bytearray, where: str) -> None:
    """Raise :class:`ArtifactError` unless ``tag`` (hex, as :func:`sign` gives it) is the manifest's under ``key``."""
    got = bytes(tag).strip()
    if not hmac.compare_digest(got, sign(key, manifest).encode()):
        raise ArtifactError(
            f"{where} does not match its signature ({SIGNATURE}) under the key given: the manifest or its programs "
            "were altered, swapped, or signed with another key. Refusing to load it.")
