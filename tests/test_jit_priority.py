"""The driver JVM's C2 compiler runs below the threads doing the work
(`txstream.service.spark._lower_c2_priority`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from txstream.service.spark import C2_NICE_STEPS

# A session of its own, in a JVM with both compilers, as if on 16 cores (HotSpot then starts
# 8 C2 and 4 C1 threads): each compiler thread's nice value, by thread id.
_SESSION = textwrap.dedent("""
    import json
    import os
    from pathlib import Path
    from txstream.service.spark import get_spark
    spark = get_spark(java_options="-XX:ActiveProcessorCount=16")
    pid = spark.sparkContext._gateway.proc.pid
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        name = (task / "comm").read_text().strip()
        if "CompilerThre" in name:
            threads[task.name] = [name, os.getpriority(os.PRIO_PROCESS, int(task.name))]
    print(json.dumps(threads))
""")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="finds threads in /proc")
def test_every_c2_compiler_thread_runs_lower_and_c1_does_not() -> None:
    # The tests' own JVMs run C1 only (`TEST_JAVA_OPTIONS` in the Makefile): not this one.
    tool_options = os.environ.get("JAVA_TOOL_OPTIONS", "").replace("-XX:TieredStopAtLevel=1", "")
    env = {**os.environ, "JAVA_TOOL_OPTIONS": tool_options}
    done = subprocess.run([sys.executable, "-c", _SESSION], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    threads = json.loads(done.stdout.strip().splitlines()[-1]).values()
    own = os.getpriority(os.PRIO_PROCESS, 0)  # the JVM's, inherited through spark-submit
    c2 = [nice for name, nice in threads if name.startswith("C2 ")]
    c1 = [nice for name, nice in threads if name.startswith("C1 ")]
    assert len(c2) == 8 and len(c1) == 4, f"all compiler threads at start expected: {threads}"
    assert c2 == [min(19, own + C2_NICE_STEPS)] * 8
    assert c1 == [own] * 4
