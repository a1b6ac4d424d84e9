"""Process-wide jaxaot settings: ``jaxaot.config``.

Example:
    >>> import jaxaot
    >>> with jaxaot.config.override(cache_dir=None):
    ...     jaxaot.config.cache_dir is None
    True
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Iterator

#: The environment variable that sets the default ``cache_dir``.
CACHE_DIR_ENV = "JAXAOT_CACHE_DIR"


def _cache_dir_from_env() -> str | None:
    return os.environ.get(CACHE_DIR_ENV) or None


@dataclasses.dataclass
class Config:
    """Mutable settings, read at the moment they are needed (not captured).

    Attributes:
      cache_dir: directory of the persistent compile cache (partitions and
        compiled executables, see :mod:`jaxaot._src.compile.cache`); ``None`` turns it off.
        Defaults to the ``JAXAOT_CACHE_DIR`` environment variable.
    """

    cache_dir: str | os.PathLike | None = dataclasses.field(default_factory=_cache_dir_from_env)

    @contextlib.contextmanager
    def override(self, **changes: Any) -> Iterator["Config"]:
        """Set some fields for the duration of a ``with`` block, then restore them.

        Example:
            >>> import jaxaot
            >>> with jaxaot.config.override(cache_dir="/tmp/jaxaot-cache"):
            ...     str(jaxaot.config.cache_dir)
            '/tmp/jaxaot-cache'
        """
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise AttributeError(f"jaxaot.config has no setting {sorted(unknown)}")
        old = {k: getattr(self, k) for k in changes}
        for k, v in changes.items():
            setattr(self, k, v)
        try:
            yield self
        finally:
            for k, v in old.items():
                setattr(self, k, v)


config = Config()
