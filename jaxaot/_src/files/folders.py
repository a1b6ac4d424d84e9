"""Which folders jaxaot trusts with files it will read back: its own, and no one else's.

A file is only as safe as the folder that holds it: whoever can write the
folder can rename, replace or add files there. So, as ssh refuses a
group-writable ``~/.ssh``, every folder holding something jaxaot reads back
(the compile cache's levels, the op-cost tables' folder, the key's folder) is
checked on each use by :func:`check_folder`: it must be a directory owned by
this user that neither group nor others can write. Folders jaxaot creates are
created 0700. Below a configured folder, a symlink in place of a directory is
refused too (:func:`check_folders`).

Example:
    >>> import os, pathlib, tempfile
    >>> from jaxaot._src.files import UnsafeFolderError, check_folders
    >>> base = pathlib.Path(tempfile.mkdtemp())
    >>> check_folders(base, "a", "b", create=True) == base / "a" / "b"
    True
    >>> os.chmod(base / "a", 0o777)
    >>> check_folders(base, "a", "b", create=True)
    Traceback (most recent call last):
    ...
    jaxaot._src.files.folders.UnsafeFolderError: .../a: it is writable by group and others (mode 777)
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from jaxaot._src.files.reading import UnsafeFileError, describe_mode


class UnsafeFolderError(UnsafeFileError):
    """A folder jaxaot must not trust: not a directory, another user's, or writable by group or others.

    Attributes:
      path: the folder.
      why: the reason, without the path (``"it is writable by others (mode 777)"``).
    """

    def __init__(self, path: Path, why: str):
        super().__init__(f"{path}: {why}")
        self.path, self.why = Path(path), why


def untrusted(path_or_stat: Path | os.stat_result) -> str | None:
    """Why a file or directory must not be trusted (owned by another user, writable by group/others), or None."""
    st = path_or_stat if isinstance(path_or_stat, os.stat_result) else os.stat(path_or_stat)
    uid = os.getuid() if hasattr(os, "getuid") else st.st_uid
    if st.st_uid != uid:
        return f"it is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = {stat.S_IWGRP: "group", stat.S_IWOTH: "others"}.get(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH),
                                                                   "group and others")
        return f"it is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private(st: os.stat_result) -> str | None:
    """Why a file must not hold a secret (:func:`untrusted`, or readable by group or others), or None."""
    return untrusted(st) or ("it is readable by group or others" if st.st_mode & 0o077 else None)


def check_folder(path: Path | str, *, follow: bool, create: bool) -> Path:
    """``path``, a directory of this user that no one else can write; created 0700 when absent and ``create``.

    ``follow``: whether ``path`` itself may be a symlink to such a directory (a
    folder the user configured may; the ones jaxaot makes below it may not).

    Raises:
      UnsafeFolderError: not a directory (a symlink where ``follow`` is False),
        owned by another user, or writable by group or others.
      FileNotFoundError: absent, and not ``create``.
      OSError: it cannot be created or inspected.
    """
    path = Path(path)
    if create and not os.path.lexists(path):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.stat(path) if follow else os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolderError(path, f"it is {describe_mode(st.st_mode)}, not a directory")
    why = untrusted(st)
    if why:
        raise UnsafeFolderError(path, why)
    return path


def check_folders(base: Path | str, *names: str, create: bool) -> Path:
    """``base / names[0] / ...``, each level checked by :func:`check_folder` (only ``base`` may be a symlink)."""
    path = check_folder(base, follow=True, create=create)
    for name in names:
        path = check_folder(path / name, follow=False, create=create)
    return path


#: Folders every user shares: a cache there is advised away, never chmod-ed.
SHARED_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm")


def folder_advice(d: Path) -> str:
    """How to fix a refused folder ``d``: ``chmod 700`` only where it is this user's own folder; for another
    user's folder, a shared one (sticky, like ``/tmp``) or the system's temporary folder, choosing a private
    ``cache_dir`` (closing a shared folder to others would break it for them)."""
    shared = {os.path.realpath(p) for p in (*SHARED_FOLDERS, tempfile.gettempdir())}
    try:
        st = os.stat(d)
    except OSError:
        st = None
    if os.path.realpath(d) in shared or (st is not None and st.st_mode & stat.S_ISVTX):
        why = "a shared temporary folder"
    elif st is None or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        why = "not a folder of yours"
    else:
        return f"fix it with chmod 700 {d}, or choose another jaxaot.config.cache_dir."
    return (f"{d} is {why}: leave its permissions alone and set jaxaot.config.cache_dir (JAXAOT_CACHE_DIR) "
            "to a private folder of yours, such as ~/.cache/jaxaot.")
