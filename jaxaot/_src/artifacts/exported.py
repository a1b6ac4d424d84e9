"""``ExportedAOT``: the three exported programs of a function and their signature, in memory."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from jaxaot._src.artifacts import manifest, signing
from jaxaot._src.artifacts.aot_signature import AOTSignature
from jaxaot._src.files import folder_to_write


@dataclasses.dataclass(frozen=True)
class ExportedAOT:
    """The exported inference, forward and backward programs and their signature.

    Attributes:
      inference / forward / backward: ``jax.export.Exported`` objects.
      signature: the calling contract: the input and output structures and specs, which inputs
        get gradients, which values the backward captures.
      name: the function's name.
    """

    inference: Any
    forward: Any
    backward: Any
    signature: AOTSignature
    name: str = "exported"

    @property
    def platforms(self) -> tuple[str, ...]:
        return tuple(self.forward.platforms)

    def save(self, path: str | Path, *, key: bytes | None = None) -> Path:
        """Write the manifest and the serialized programs as the directory ``path``.

        The files are written into a fresh folder that then takes the place of
        ``path``: an interrupted re-save
        leaves the earlier artifact whole. An existing ``path`` must be an empty
        folder or an artifact. With ``key`` (at least 16 secret bytes) the
        artifact is signed, and ``jaxaot.export.load(path, key=key)`` refuses it if
        anything in it changes (``docs/security.md``, "What loading an artifact checks").

        Example:
            >>> import jax.numpy as jnp, jaxaot, tempfile
            >>> exp = jaxaot.export.export(lambda x: jnp.sin(x).sum(), jnp.ones(3))
            >>> sorted(p.name for p in exp.save(tempfile.mkdtemp()).iterdir())
            ['backward.jaxexport', 'forward.jaxexport', 'inference.jaxexport', 'manifest.json']
        """
        path = folder_to_write("save", path)
        key = signing.check_key("save", key)
        programs = {name: getattr(self, name) for name in manifest.PROGRAMS}
        return manifest.write(path, self.name, programs, self.signature.to_json(), key=key)

    def __repr__(self) -> str:
        s = self.signature
        return (f"ExportedAOT({self.name}: {len(s.in_specs)} inputs, {s.num_outputs} outputs, "
                f"{len(s.residual_specs)} residuals, platforms={self.platforms})")
