"""Headless Chromium (Debian's `chromium`) driven over the DevTools protocol on a pipe
(`--remote-debugging-pipe`: JSON messages, each ending in a NUL byte, read by the browser from
its fd 3 and written to its fd 4), so the page tests need neither WebDriver nor a WebSocket
client."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest


def _high(fd: int) -> int:
    """`fd` moved above 4: the shell below must not overwrite one end with the other."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class BrowserError(RuntimeError):
    """The browser answered a command with an error, or not in time."""


class Browser:
    """One headless browser with one page, closed by `close`."""

    def __init__(self, profile: Path) -> None:
        binary = next((path for name in ("chromium", "chromium-browser", "google-chrome")
                       if (path := shutil.which(name))), None)
        if binary is None:
            pytest.fail("Chromium is not installed: `apt-get install chromium` (`make install` "
                        "does it)", pytrace=False)
        to_browser, browser_in = map(_high, os.pipe()[::-1])  # (write end, read end)
        browser_out, from_browser = map(_high, os.pipe()[::-1])
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--no-first-run", "--mute-audio",
                 "--remote-debugging-pipe", f"--user-data-dir={profile}",
                 "--window-size=1200,900", "about:blank"]
        # Spawned with the pipe's ends at fds 3 and 4, where the browser expects them.
        self.pid = os.posix_spawn(binary, [binary, *flags], os.environ, file_actions=[
            (os.POSIX_SPAWN_DUP2, browser_in, 3), (os.POSIX_SPAWN_DUP2, browser_out, 4),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])
        os.close(browser_in)
        os.close(browser_out)
        self._out = os.fdopen(to_browser, "wb", buffering=0)
        self._in = from_browser
        self._buffer = b""
        self._id = 0
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.call("Target.attachToTarget",
                                  {"targetId": target, "flatten": True})["sessionId"]
        self.page("Page.enable")

    def call(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, timeout: float = 30) -> dict[str, Any]:
        self._id += 1
        request: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session is not None:
            request["sessionId"] = session
        self._out.write(json.dumps(request).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:  # events come in between; only the reply matters here
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply["result"]

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise BrowserError("the browser did not answer in time")
            chunk = os.read(self._in, 1 << 16)
            if not chunk:
                raise BrowserError("the browser exited")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def page(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.call(method, params, self._session)

    def open(self, url: str) -> None:
        self.page("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        result = self.page("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> Any:
        """The value of `expression` once it is truthy."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"still false after {timeout} s: {expression}")
            time.sleep(0.1)

    def screenshot(self, path: Path) -> Path:
        data = self.page("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with contextlib.suppress(BrowserError, OSError):  # it may be gone already
            self.call("Browser.close", timeout=5)
        deadline = time.monotonic() + 10
        while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                break
            time.sleep(0.1)
        self._out.close()
        os.close(self._in)
