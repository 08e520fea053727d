"""`txstream run CONFIG` in a subprocess (`ServiceProcess`), and reading its HTTP endpoint
(`scrape`, `metric`)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def scrape(port: int, path: str = "/metrics", timeout: float = 5) -> tuple[int, str]:
    """(status, body) of the service's HTTP endpoint; (0, reason) when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def metric(body: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)} (\S+)$", body, re.MULTILINE)
    return float(m.group(1)) if m else None


def child_pids(pid: int) -> list[int]:
    """The pids of `pid`'s child processes (the service's: its driver JVM), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # the process ended
                continue
            # `pid (comm) state ppid ...`; comm may hold spaces, so split after its ')'.
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class ServiceProcess:
    """`txstream run CONFIG` in a subprocess, with its output in a log file. Without the
    engine's warm-up unless `warm_up`: it costs each start of a cold JVM seconds, and the crash
    test below runs it."""

    def __init__(self, config: Path, env: dict[str, str], log_path: Path,
                 warm_up: bool = False) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 (closed in wait())
        self._log_start = self._log.tell()
        self.started = time.monotonic()
        self._children: list[int] = []  # those `kill` killed
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "txstream.service.cli", "run", str(config),
             "--progress-interval", "5"],
            cwd=ROOT, env={**os.environ, "SPARK_DRIVER_MEMORY": "2g",
                           **({} if warm_up else {"TXSTREAM_WARM_UP_ROWS": "0"}), **env},
            stdout=self._log, stderr=subprocess.STDOUT)

    def wait(self, timeout: float) -> int:
        try:
            status = self.proc.wait(timeout)
            deadline = time.monotonic() + timeout
            while any(_running(pid) for pid in self._children):
                assert time.monotonic() < deadline, f"killed JVM(s) {self._children} still run"
                time.sleep(0.05)
            return status
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"txstream run did not exit within {timeout}s; log:\n"
                                 f"{self.tail()}") from None
        finally:
            self._log.close()

    def kill(self) -> None:
        """kill -9 of the service and of its driver JVM, as of a container: a JVM left to
        notice its parent's end on its own would still hold memory and CPU when the next
        service starts. `wait` waits for both."""
        if self.proc.poll() is None:
            self._children = child_pids(self.proc.pid)
            self.proc.send_signal(signal.SIGKILL)
            for pid in self._children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def _until(self, what: str, ok: Callable[[], bool], timeout: float) -> None:
        """Poll `ok()` while the process runs; on failure kill it and show its log."""
        deadline = time.monotonic() + timeout
        while not ok():
            if self.proc.poll() is not None:
                raise AssertionError(f"txstream run exited ({self.proc.returncode}) before "
                                     f"{what}:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"no {what} within {timeout}s:\n{self.tail()}")
            time.sleep(0.5)

    def wait_for_metrics(self, port: int, ok: Callable[[str], bool], timeout: float) -> str:
        """Poll /metrics until `ok(body)`; the body."""
        last = [""]

        def check() -> bool:
            status, last[0] = scrape(port)
            return status == 200 and ok(last[0])

        self._until("/metrics condition", check, timeout)
        return last[0]

    def wait_for_ready(self, port: int, timeout: float) -> None:
        """Until `/readyz` answers 200."""
        self._until("/readyz 200", lambda: scrape(port, "/readyz")[0] == 200, timeout)

    def wait_for_log(self, text: str, timeout: float) -> None:
        """Until `text` appears in the log of this process."""
        self._until(repr(text), lambda: text in self.log_path.read_bytes()[
            self._log_start:].decode(errors="replace"), timeout)
