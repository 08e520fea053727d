"""The driver JVM's C2 compiler runs below the threads doing the work
(`txstream.service.spark._lower_c2_priority`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from txstream.service.spark import C2_NICE

# A session of its own, in a JVM with both compilers: the tests' own JVMs run C1 only
# (`TEST_JAVA_OPTIONS` in the Makefile), so they have no C2 thread to look at.
_SESSION = textwrap.dedent("""
    import json, os
    from pathlib import Path
    from txstream.service.spark import get_spark
    spark = get_spark()
    pid = spark.sparkContext._gateway.proc.pid
    nice = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        name = (task / "comm").read_text().strip()
        if "CompilerThre" in name:
            nice[name] = int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])
    print(json.dumps(nice))
""")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="finds threads in /proc")
def test_the_c2_compiler_thread_runs_niced_and_c1_does_not() -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"}
    done = subprocess.run([sys.executable, "-c", _SESSION], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    nice = json.loads(done.stdout.strip().splitlines()[-1])
    c2 = {name: value for name, value in nice.items() if name.startswith("C2 ")}
    c1 = {name: value for name, value in nice.items() if name.startswith("C1 ")}
    assert c2 and c1, f"both compilers' threads expected, found {nice}"
    assert set(c2.values()) == {C2_NICE}
    assert set(c1.values()) == {os.getpriority(os.PRIO_PROCESS, 0)}
