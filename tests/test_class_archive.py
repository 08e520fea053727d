"""The driver JVM's class archive (`txstream.service.class_archive`): keyed by Spark's version
and the `java` binary, used by a new session when it exists, written only by a JVM of its own."""

from __future__ import annotations

import os
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from txstream.service import class_archive, prepare
from txstream.service.class_archive import ClassArchiveError


@pytest.fixture
def fake_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(class_archive.ENV, raising=False)
    return java


def test_the_archive_is_keyed_by_spark_and_the_java_binary(fake_java: Path) -> None:
    path = class_archive.archive_path()
    assert path is not None
    assert path.parent == fake_java.parents[2] / "cache" / "txstream"
    assert path.name.startswith(f"spark-{pyspark.__version__}-") and path.suffix == ".jsa"
    assert class_archive.java_options() == "", "no archive written yet: no option"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    assert class_archive.java_options() == f'"-XX:SharedArchiveFile={path}"'
    # Another JVM in the same place (an upgrade): another archive, not the stale one.
    os.utime(fake_java, ns=(0, 0))
    assert class_archive.archive_path() != path
    assert class_archive.java_options() == ""


def test_archives_no_installation_can_use_are_swept(fake_java: Path, tmp_path: Path) -> None:
    """Other Spark versions' archives, and this version's whose SPARK_HOME is gone (a removed
    checkout), are deleted; another existing installation's stays, as does one that names no
    SPARK_HOME (written before archives did)."""
    path = class_archive.archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    version = f"spark-{pyspark.__version__}-"

    def archive(name: str, home: Path | None) -> Path:
        made = path.parent / name
        made.write_bytes(b"archive")
        if home is not None:
            (path.parent / f"{name}.home").write_text(f"{home}\n")
        return made

    mine = archive(path.name, tmp_path)
    older = archive("spark-3.5.0-0123456789abcdef.jsa", tmp_path)
    removed = archive(f"{version}1111111111111111.jsa", tmp_path / "gone")
    other = archive(f"{version}2222222222222222.jsa", tmp_path)
    unnamed = archive(f"{version}3333333333333333.jsa", None)
    assert sorted(class_archive.sweep(path)) == sorted([older, removed])
    assert sorted(path.parent.iterdir()) == sorted([
        mine, path.parent / f"{mine.name}.home", other, path.parent / f"{other.name}.home",
        unnamed])


def test_the_environment_names_another_archive_or_none(
        fake_java: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(class_archive.ENV, str(tmp_path / "mine.jsa"))
    assert class_archive.archive_path() == tmp_path / "mine.jsa"
    monkeypatch.setenv(class_archive.ENV, "off")
    assert class_archive.archive_path() is None and class_archive.java_options() == ""
    with pytest.raises(ClassArchiveError, match="=off"):
        prepare.prepare()


def test_the_session_maps_the_archive_and_prepare_needs_a_jvm_of_its_own(
        spark: SparkSession) -> None:
    # `make install` writes the archive (`txstream prepare`); the tests' session, started by
    # get_spark, uses it exactly when this installation has one.
    used = spark.sparkContext.getConf().get("spark.driver.defaultJavaOptions", "")
    archive = class_archive.java_options()
    assert used.startswith(archive) and ("-XX:SharedArchiveFile=" in used) == bool(archive)
    with pytest.raises(ClassArchiveError, match="has started a Spark JVM already"):
        prepare.prepare()
