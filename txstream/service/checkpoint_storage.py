"""Where checkpoints are stored: the few file operations `txstream.service.checkpoint` needs,
on a local directory (`LocalStorage`) or at any Hadoop-compatible URI Spark can write
(`HadoopStorage`: s3a://, hdfs://, file://, through the Hadoop FileSystem of Spark's JVM).

Every write is whole or absent (`write_text` renames a temporary file; `create_new` creates
only what does not exist, atomically where `fences` says so), and `make_durable` makes what was
written survive a power loss: the checkpoint store's rule that a checkpoint is complete exactly
when its manifest exists rests on these.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or does not fit this pipeline; the message says what to
    do."""


class CheckpointStorageError(CheckpointError):
    """The storage refused a write it should take (full, read-only, unreachable): the same
    write may succeed once the operator frees space or mends it, so callers retry it."""


class Storage(Protocol):
    """The few file operations checkpoints need, on one root directory."""

    root: str
    fences: bool  # create_new is atomic here

    def uri(self, rel: str) -> str: ...  # what Spark writes to

    def list(self, rel: str) -> list[str]: ...  # child names; [] when absent

    def read_text(self, rel: str) -> str | None: ...

    def write_text(self, rel: str, text: str) -> None: ...  # atomic: whole or absent

    def create_new(self, rel: str, text: str) -> bool: ...  # False: it exists already

    def put_dir(self, local: Path, rel: str) -> None: ...  # copy a local directory there

    @contextlib.contextmanager
    def local_copy(self, rel: str) -> Iterator[Path]: ...

    def make_durable(self, rel: str) -> None: ...  # everything under rel survives a power loss

    def delete(self, rel: str) -> None: ...


class LocalStorage:
    """A directory on this machine (or a shared file system mounted here)."""

    fences = True  # O_EXCL: atomic on local file systems and on NFS since v3

    def __init__(self, root: Path) -> None:
        self.root = str(root.resolve())
        self._root = root.resolve()

    def uri(self, rel: str) -> str:
        return str(self._root / rel)

    def list(self, rel: str) -> list[str]:
        path = self._root / rel
        return sorted(p.name for p in path.iterdir()) if path.is_dir() else []

    def read_text(self, rel: str) -> str | None:
        try:
            return (self._root / rel).read_text()
        except FileNotFoundError:
            return None

    def write_text(self, rel: str, text: str) -> None:
        path = self._root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError:
            # On a full disk the partial file would hold space no listing ever names.
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)

    def create_new(self, rel: str, text: str) -> bool:
        path = self._root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        except OSError:
            # Created but not written (a full disk): gone, so that the same name is tried
            # again rather than left empty forever.
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        else:
            os.close(fd)
        _fsync_dir(path.parent)
        return True

    def put_dir(self, local: Path, rel: str) -> None:
        shutil.copytree(local, self._root / rel)

    @contextlib.contextmanager
    def local_copy(self, rel: str) -> Iterator[Path]:
        yield self._root / rel

    def make_durable(self, rel: str) -> None:
        # Without this a machine crash could keep the manifest but lose data files it names.
        top = self._root / rel
        for dirpath, _, files in os.walk(top):
            for name in files:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            _fsync_dir(Path(dirpath))
        _fsync_dir(top.parent)

    def delete(self, rel: str) -> None:
        path = self._root / rel
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HadoopStorage:
    """A Hadoop-compatible location, through the Hadoop FileSystem of Spark's JVM (so every
    scheme and credential Spark is configured for works here too)."""

    def __init__(self, root: str, spark: SparkSession) -> None:
        self.root = root.rstrip("/")
        # The NameNode creates a file with overwrite=false atomically; other Hadoop file
        # systems check for it first, then write (S3A, and the local one behind file://).
        self.fences = root.lower().startswith("hdfs://")
        jvm = spark.sparkContext._jvm
        assert jvm is not None, "a SparkSession has a JVM gateway"
        self._path_class = jvm.org.apache.hadoop.fs.Path
        self._fs = self._path(self.root).getFileSystem(
            spark.sparkContext._jsc.hadoopConfiguration())  # type: ignore[union-attr]

    def _path(self, rel: str):  # type: ignore[no-untyped-def]  # a py4j JavaObject
        return self._path_class(self.uri(rel))

    def uri(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def list(self, rel: str) -> list[str]:
        path = self._path(rel)
        if not self._fs.exists(path):
            return []
        return sorted(str(s.getPath().getName()) for s in self._fs.listStatus(path))

    def read_text(self, rel: str) -> str | None:
        if not self._fs.exists(self._path(rel)):
            return None
        with self.local_copy(rel) as local:
            return local.read_text()

    def write_text(self, rel: str, text: str) -> None:
        final = self._path(rel)
        tmp = self._path(f"{rel}.tmp")
        with tempfile.TemporaryDirectory(prefix="txstream-") as scratch:
            local = Path(scratch) / "file"
            local.write_text(text)
            self._fs.copyFromLocalFile(False, True, self._path_class(str(local)), tmp)
        if not self._fs.rename(tmp, final):
            raise CheckpointError(f"could not rename {tmp} to {final}: does it exist already?")

    def create_new(self, rel: str, text: str) -> bool:
        try:
            out = self._fs.create(self._path(rel), False)  # overwrite=false
        except Exception as exc:  # py4j's Py4JJavaError, whose JVM exception tells why
            java = getattr(exc, "java_exception", None)
            if java is not None and java.getClass().getName() == \
                    "org.apache.hadoop.fs.FileAlreadyExistsException":
                return False
            raise
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        return True

    def put_dir(self, local: Path, rel: str) -> None:
        self._fs.copyFromLocalFile(False, True, self._path_class(str(local)), self._path(rel))

    @contextlib.contextmanager
    def local_copy(self, rel: str) -> Iterator[Path]:
        with tempfile.TemporaryDirectory(prefix="txstream-") as scratch:
            local = Path(scratch) / "copy"
            # Raw local file system: no .crc side files in the scratch copy.
            self._fs.copyToLocalFile(False, self._path(rel), self._path_class(str(local)), True)
            yield local

    def make_durable(self, rel: str) -> None:
        return None  # a Hadoop file system makes a closed file durable itself

    def delete(self, rel: str) -> None:
        self._fs.delete(self._path(rel), True)


def open_storage(location: str, spark: SparkSession) -> Storage:
    """The storage at `location`: a Hadoop-compatible URI (`scheme://...`) through `spark`'s
    JVM, else a local directory."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", location):
        return HadoopStorage(location, spark)
    return LocalStorage(Path(location))
