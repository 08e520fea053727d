"""A small size-limited file system for tests of a full disk: a tmpfs of a few MiB mounted on
a test's directory (`small_volume`), and a file that takes all of its free space but what a
test leaves (`Filler`). Mounting needs root (`can_mount`), which CI has."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_CHUNK = 64 * 1024


def can_mount() -> bool:
    return os.geteuid() == 0


@contextmanager
def small_volume(path: Path, mib: int) -> Iterator[Path]:
    """A tmpfs of `mib` MiB mounted on `path` (created), unmounted on exit."""
    if not can_mount():
        raise PermissionError("mounting a size-limited tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(path)],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


class Filler:
    """One file on a volume that takes its free space, leaving `fill(leave=...)` bytes."""

    def __init__(self, volume: Path) -> None:
        self.path = volume / "filler"

    def fill(self, leave: int = 0) -> None:
        """Grow the file until the volume is full, then give back `leave` bytes."""
        # Unbuffered: a buffer left over at ENOSPC would fail again on close.
        with open(self.path, "ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * _CHUNK)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        size = self.path.stat().st_size
        os.truncate(self.path, max(0, size - leave))

    def free(self) -> None:
        self.path.unlink(missing_ok=True)

    @staticmethod
    def free_bytes(volume: Path) -> int:
        stat = os.statvfs(volume)
        return stat.f_bavail * stat.f_frsize
