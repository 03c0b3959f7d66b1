"""Writing a checkpoint file safely: the target is checked first (directory exists and is
writable, name length), then the bytes go to a temporary file in the same directory, are
fsync'ed and renamed over the target (``os.replace``), so a reader sees the old file or the
new one, never half of one; temporary files of killed writers are cleaned up."""
from __future__ import annotations

import errno
import os
import re
import tempfile
import zlib

__all__ = ["fspath", "file_path", "writable_target", "check_target", "atomic_write"]


def fspath(path) -> str:
    try:
        return os.fspath(path)
    except TypeError:
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}") from None


def file_path(path) -> str:
    """``path`` as a str naming a file: an empty path or one ending in a separator (a
    directory's name) is a ValueError naming it, not a file written under another name."""
    p = fspath(path)
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not p or p.endswith(("/", os.sep)) or os.path.basename(p) in (".", ".."):
        raise ValueError(f"path: expected a file name, got {p!r} (a directory's name or empty)")
    return p


def writable_target(path: str) -> str:
    """The file ``save`` replaces for ``path``: a symbolic link is followed (the link stays,
    its target is replaced, as ``open(path, "w")`` would write through it); a directory or a
    file without write permission is refused, even for a user who could replace it."""
    real = os.path.realpath(path)
    if os.path.isdir(real):
        raise IsADirectoryError(errno.EISDIR, f"{path}: is a directory; save writes a file",
                                path)
    if os.path.exists(real):
        st = os.stat(real)
        if not st.st_mode & 0o222 or not os.access(real, os.W_OK):
            raise PermissionError(errno.EACCES, f"{path}: the file is read-only; save does not "
                                  f"replace it (make it writable or remove it first)", path)
    return real


_TMP_END = ".tmp"
_TMP_START = ".blasnet-"


def _temp_prefix(base: str) -> str:
    """``.blasnet-<crc>-<pid>-``: mkstemp appends 8 random characters and ``.tmp``. A short
    hidden name of fixed length (38 characters) fits beside any file name the file system
    takes; the CRC-32 of the target's name tells whose temporary file it is."""
    return f"{_TMP_START}{zlib.crc32(os.fsencode(base)):08x}-{os.getpid()}-"


def _remove_stale_temps(directory: str, prefix: str) -> None:
    """Remove the temporary files that earlier saves of the same target left behind when
    their process was killed: names ``prefix`` (without its pid) + ``<pid>-<8 chars>.tmp``
    whose process no longer runs on this machine. Others' and our own are left alone."""
    stem = prefix[:prefix.rstrip("-").rfind("-") + 1]  # ".blasnet-<crc>-"
    pattern = re.compile(re.escape(stem) + r"(\d+)-[A-Za-z0-9_]{8}" + re.escape(_TMP_END) + "$")
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        m = pattern.match(name)
        if m is None or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass


def check_target(path, what: str = "path") -> str:
    """``path`` if ``save`` can write it, else ValueError naming ``what``: the checks ``save``
    makes (a file name, not a directory; an existing file is writable, by its mode bits too,
    since ``save`` does not replace a read-only file even for root), then a probe file with
    the temporary name ``save`` writes first, created and removed in the directory (the one
    sure test of writability: root passes ``os.access`` almost everywhere)."""
    try:
        p = file_path(path)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    try:
        real = writable_target(p)
    except OSError as e:
        raise ValueError(f"{what}: {e.strerror}") from None
    directory = os.path.dirname(os.path.abspath(real))
    if not os.path.isdir(directory):
        raise ValueError(f"{what}: the directory {directory!r} does not exist")
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=_temp_prefix(os.path.basename(real)),
                                     suffix=_TMP_END)
    except OSError as e:
        raise ValueError(f"{what}: cannot write in {directory!r} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)
    return p


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # another user's process (or an odd pid): keep its file
    return True


def atomic_write(path: str, write) -> None:
    """Call ``write(file)`` on a temporary file next to ``path``, then rename it to ``path``
    (after removing stale temporary files of killed saves of the same ``path``)."""
    directory = os.path.dirname(os.path.abspath(path))
    prefix = _temp_prefix(os.path.basename(path))
    _remove_stale_temps(directory, prefix)
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=_TMP_END)
    except OSError as e:  # same type and errno, naming the target rather than the temp file
        raise type(e)(e.errno, f"{path}: cannot create a file in {directory!r} "
                      f"({e.strerror})", path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        try:  # keep the mode of the file being replaced; mkstemp creates 0600
            os.chmod(tmp, os.stat(path).st_mode & 0o7777 if os.path.exists(path) else 0o644)
        except OSError:
            pass
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    """Make the rename durable (POSIX); harmless to skip where directories cannot be opened."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
