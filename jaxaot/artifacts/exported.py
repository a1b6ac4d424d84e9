"""``ExportedAOT``: the three exported programs of a function and their signature, in memory."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from jaxaot.artifacts import manifest
from jaxaot.artifacts.signature import AOTSignature


@dataclasses.dataclass(frozen=True)
class ExportedAOT:
    """The exported inference, forward and backward programs and their signature.

    Attributes:
      inference / forward / backward: ``jax.export.Exported`` objects.
      signature: the :class:`~jaxaot.artifacts.signature.AOTSignature`.
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

    def save(self, path: str | Path) -> Path:
        """Write the manifest and the serialized programs into the directory ``path``.

        Files are written atomically, the manifest last (:mod:`jaxaot.artifacts.manifest`).

        Example:
            >>> import jax.numpy as jnp, jaxaot, tempfile
            >>> exp = jaxaot.export(lambda x: jnp.sin(x).sum(), jnp.ones(3))
            >>> sorted(p.name for p in exp.save(tempfile.mkdtemp()).iterdir())
            ['backward.jaxexport', 'forward.jaxexport', 'inference.jaxexport', 'manifest.json']
        """
        programs = {name: getattr(self, name) for name in manifest.PROGRAMS}
        return manifest.write(Path(path), self.name, programs, self.signature.to_json())

    def __repr__(self) -> str:
        s = self.signature
        return (f"ExportedAOT({self.name}: {len(s.in_specs)} inputs, {s.num_outputs} outputs, "
                f"{len(s.residual_specs)} residuals, platforms={self.platforms})")
