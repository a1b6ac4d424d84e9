"""Files jaxaot reads and writes: one safe way for every store (compile cache, artifacts, the key, op-cost tables).

* :mod:`.reading`: :func:`read_regular`, the only reader of such files
  (``O_NOFOLLOW | O_NONBLOCK``, a regular file, its size compared with the
  declared or largest size before reading, the sha256 streamed);
* :mod:`.bounded_json`: :func:`parse_json`, JSON with a bound on its nesting;
* :mod:`.folders`: :func:`check_folder` / :func:`check_folders`, which folders
  may hold files read back (this user's, writable by no one else);
* :mod:`.writing`: :func:`atomic_write`, :func:`create_exclusive` and
  :func:`replace_folder`, which never leave a partial file or folder, and sweep
  the temporaries of killed writers.

``tests/compile/test_one_reader.py`` checks that no other module of jaxaot
opens or reads a file.
"""

from jaxaot._src.files.bounded_json import NestingError, json_depth, parse_json
from jaxaot._src.files.folders import UnsafeFolderError, check_folder, check_folders, private, untrusted
from jaxaot._src.files.reading import (
    READ_FLAGS, FileMismatchError, FileTooLargeError, UnsafeFileError, describe_mode, read_regular,
)
from jaxaot._src.files.writing import STALE_SECONDS, atomic_write, create_exclusive, replace_folder, sweep_stale

__all__ = [
    "READ_FLAGS", "STALE_SECONDS", "FileMismatchError", "FileTooLargeError", "NestingError", "UnsafeFileError",
    "UnsafeFolderError", "atomic_write", "check_folder", "check_folders", "create_exclusive", "describe_mode",
    "json_depth", "parse_json", "private", "read_regular", "replace_folder", "sweep_stale", "untrusted",
]
