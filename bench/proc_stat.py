"""What Linux's /proc says of a process or a thread: its name, parent, CPU time and start (the
benchmarks' CPU figures: `bench/scale.py`'s by kind of thread, `bench/engine.py`'s JIT)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def read(path: Path) -> str:
    """A /proc file's text; any byte that is not UTF-8 replaced (a command line may hold one)."""
    return path.read_bytes().decode(errors="replace")


@dataclass(frozen=True)
class Stat:
    """What a /proc `stat` line says of a process or a thread."""

    name: str
    parent: int
    ticks: int  # CPU time, user and system; of a process, its threads' that ended too
    start: int  # when it started, in ticks after boot: with the pid, names one process

    @staticmethod
    def of(path: Path) -> Stat:
        stat = read(path)
        fields = stat[stat.rindex(")") + 2:].split()  # from the third field, the state
        return Stat(stat[stat.index("(") + 1:stat.rindex(")")], int(fields[1]),
                    int(fields[11]) + int(fields[12]), int(fields[19]))
