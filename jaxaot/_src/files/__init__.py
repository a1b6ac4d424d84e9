"""Files jaxaot reads and writes: one safe way for every store (compile cache, artifacts, the key, op-cost tables).

One reader (:func:`read_regular`: no symlinks, FIFOs or oversized files), JSON
with bounded nesting (:func:`parse_json`), the folders trusted to hold files read
back (:func:`check_folder`), and writers that never leave a partial file or folder
(:func:`atomic_write`, :func:`create_exclusive`, :func:`replace_folder`, with :func:`folder_to_write` and
:func:`check_replaceable` to check its target first); :func:`discard_output` drops output no one reads.
``tests/compile/test_one_reader.py`` checks that no other module opens a file.
"""

from jaxaot._src.files.bounded_json import NestingError, json_depth, parse_json
from jaxaot._src.files.folders import (
    SHARED_FOLDERS, UnsafeFolderError, check_folder, check_folders, folder_advice, private, untrusted,
)
from jaxaot._src.files.reading import (
    READ_FLAGS, FileMismatchError, FileTooLargeError, UnsafeFileError, describe_mode, read_regular,
)
from jaxaot._src.files.writing import (
    STALE_SECONDS, atomic_write, check_replaceable, create_exclusive, discard_output, folder_to_write, replace_folder,
    sweep_stale,
)

__all__ = [
    "READ_FLAGS", "SHARED_FOLDERS", "STALE_SECONDS", "FileMismatchError", "FileTooLargeError", "NestingError",
    "UnsafeFileError", "UnsafeFolderError", "atomic_write", "check_folder", "check_folders", "check_replaceable",
    "create_exclusive", "describe_mode", "discard_output", "folder_advice", "folder_to_write", "json_depth",
    "parse_json", "private", "read_regular", "replace_folder", "sweep_stale", "untrusted",
]
