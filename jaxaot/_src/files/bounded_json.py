"""JSON parsed with a bound on its nesting: a file of 200,000 ``[`` is a typed error, not a ``RecursionError``.

:func:`parse_json` measures the nesting of the text before ``json.loads`` sees
it: strings are set aside (a bracket inside one is no nesting), and the depth
is the running count of opening less closing brackets. On any text ``json``
would parse, the two agree on where strings start and end, so nothing deeper
than ``max_depth`` reaches the parser.

Example:
    >>> from jaxaot._src.files import parse_json
    >>> parse_json(b'{"a": [1, "[[["]}', max_depth=2)
    {'a': [1, '[[[']}
    >>> parse_json(b"[" * 1000 + b"]" * 1000, max_depth=64)
    Traceback (most recent call last):
    ...
    jaxaot._src.files.bounded_json.NestingError: JSON nested 1000 levels deep, more than the limit of 64
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_OPEN = np.frombuffer(b"[{", np.uint8)
_CLOSE = np.frombuffer(b"]}", np.uint8)


class NestingError(ValueError):
    """JSON nested deeper than :func:`parse_json`'s ``max_depth``."""


def json_depth(data: bytes | bytearray | memoryview) -> int:
    """How deep the arrays and objects of JSON text nest (0 for a bare number or string)."""
    bare = np.frombuffer(_STRING.sub(b"", data), np.uint8)
    if not bare.size:
        return 0
    step = np.isin(bare, _OPEN).astype(np.int64) - np.isin(bare, _CLOSE).astype(np.int64)
    return int(np.cumsum(step).max(initial=0))


def parse_json(data: bytes | bytearray | memoryview, max_depth: int) -> Any:
    """``json.loads(data)``, refusing text nested deeper than ``max_depth``.

    Raises:
      NestingError: too deep (a ``ValueError``).
      ValueError: not JSON (``json.JSONDecodeError``) or not UTF-8.
    """
    if isinstance(data, memoryview):
        data = bytes(data)
    depth = json_depth(data)
    if depth > max_depth:
        raise NestingError(f"JSON nested {depth} levels deep, more than the limit of {max_depth}")
    try:
        return json.loads(data)
    except RecursionError:  # pragma: no cover - max_depth above the interpreter's limit
        raise NestingError(f"JSON nested too deep for this interpreter (limit given: {max_depth})") from None
