"""Atomic file writes: a reader (or the next run) sees the old file whole or the new one whole.

Every writer of a file a user keeps (benchmark reports, run caches, lab results, seed logs,
checkpoints) goes through :func:`atomic_write`: the bytes go to a temporary file in the same
folder, are flushed and fsync'ed, and then ``os.replace`` puts it in place, with the permission
bits of the file it replaces (a new file: those ``open`` gives, 0o666 less the umask). A write
that fails part-way (full disk, file-size limit, Ctrl-C, a serialiser that raises) leaves any
previous file untouched and no temporary file behind.

>>> import json, tempfile, pathlib
>>> with tempfile.TemporaryDirectory() as d:
...     path = pathlib.Path(d) / "report.json"
...     _ = write_json(path, {"ok": 1})
...     try:
...         write_json(path, {"bad": object()})     # fails while serialising
...     except TypeError:
...         pass
...     json.loads(path.read_text()), sorted(p.name for p in pathlib.Path(d).iterdir())
({'ok': 1}, ['report.json'])
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from typing import Any, Callable, IO


# the characters of the file's name its temporary file's name starts with: the whole name, with mkstemp's random
# part and ".tmp", went past the system's limit on a name (255 bytes) for a name near it (OSError "File name too
# long" for a file open() writes); 32 characters are at most 128 bytes
_TMP_NAME_CHARS = 32


def atomic_write(path, write: Callable[[IO[bytes]], Any]) -> int:
    """Call ``write(handle)`` on a temporary binary file beside ``path``, then move it into place.

    Returns the number of bytes written. ``write`` may be ``handle.write`` of bytes, or a
    serialiser such as ``lambda h: torch.save(state, h)``.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    prefix = f".{os.path.basename(path)[:_TMP_NAME_CHARS]}."
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.chmod(tmp, _mode_for(path))   # mkstemp makes 0600: the file lost the reads open() gives
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
            size = handle.tell()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    with contextlib.suppress(OSError):     # make the rename itself durable where the OS allows it
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return size


def _mode_for(path: str) -> int:
    """The permission bits the written file gets: those of the file it replaces, else what ``open`` would
    give a new file (0o666 less the umask)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask, read without changing it where the system says it (Linux), else set and put back."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_bytes(path, data: bytes) -> int:
    """Atomically write ``data`` to ``path``; returns its size."""
    return atomic_write(path, lambda handle: handle.write(data))


def write_text(path, text: str, encoding: str = "utf-8") -> int:
    """Atomically write ``text`` to ``path``."""
    return write_bytes(path, text.encode(encoding))


def write_json(path, obj, **dumps_kwargs) -> int:
    """Atomically write ``json.dumps(obj, **dumps_kwargs)`` to ``path``.

    The object is serialised before the file is opened, so an object that cannot be written
    never touches the disk.
    """
    return write_text(path, json.dumps(obj, **dumps_kwargs))
