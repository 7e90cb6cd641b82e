"""A directory beside the event socket that the sidecar's jobs write into (the device-profile spool, the position
records): made with the socket's reach, or taken over from a sidecar that died."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def mode_for(socket_mode: int) -> int:
    """Those allowed to connect (the socket's owner, its group where ``socket_mode`` admits it) may create and remove
    files in the directory, but not list them."""
    return 0o700 | (0o030 if socket_mode & 0o020 else 0)


def make(path: Path, mode: int) -> None:
    """Make ``path`` with ``mode``, or take over the directory there; anything else at the path is left alone."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise NotADirectoryError(f"{path} exists and is not a directory") from None
    os.chmod(path, mode)  # mkdir's mode passes through the umask
