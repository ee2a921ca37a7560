"""Headless Chromium driven over the DevTools protocol, with the standard library only.

Chromium started with ``--remote-debugging-pipe`` reads protocol commands from file
descriptor 3 and writes replies and events to descriptor 4, each message JSON ended by a
NUL byte: no websocket and no port, so no client library is needed. :class:`Browser`
opens pages, evaluates JavaScript in them and takes screenshots; the site tests use it
to look at the pages as a reader's browser renders them.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

#: The flags every start uses: no sandbox (CI runs as root), no GPU, and nothing that
#: reaches for the network (there is none), in a profile of its own.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)
INSTALL_HINT = "apt-get install -y chromium"


def find_chromium() -> str | None:
    """The Chromium executable on ``PATH`` (Debian's ``chromium`` package), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return None


class BrowserError(RuntimeError):
    """Chromium failed, answered with an error, or did not answer in time."""


class Browser:
    """One headless Chromium process with one page tab; use it as a context manager."""

    def __init__(self, executable: str, width: int = 1280, height: int = 900, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="forge-chromium-")
        self._stderr = tempfile.TemporaryFile()
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # Chromium wants the pipe on descriptors 3 and 4 exactly; bash maps them there from
        # descriptors numbered high enough not to collide with 3 and 4 (dash cannot name
        # descriptors above 9).
        child_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
        child_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
        for fd in (to_browser_r, from_browser_w):
            os.close(fd)
        argv = [executable, *FLAGS, f"--user-data-dir={self._profile.name}", "about:blank"]
        self._process = subprocess.Popen(
            ["bash", "-c", f'exec "$@" 3<&{child_r} 4>&{child_w} {child_r}<&- {child_w}>&-', "bash", *argv],
            pass_fds=(child_r, child_w),
            stdin=subprocess.DEVNULL,
            stdout=self._stderr,
            stderr=self._stderr,
        )
        os.close(child_r)
        os.close(child_w)
        self._buffer = b""
        self._events: list[dict[str, Any]] = []
        self._next_id = 0
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            self.call("Page.enable", session=True)
            self.call(
                "Emulation.setDeviceMetricsOverride",
                session=True,
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
        except BaseException:
            self.close()
            raise

    # --- the protocol ---------------------------------------------------------------

    def _log(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")[-4000:]

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise BrowserError(
                    f"chromium did not answer within {self.timeout:.0f} s; its log:\n{self._log()}"
                )
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium exited ({self._process.poll()}); its log:\n{self._log()}")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        """Send one command (to the page's session if ``session``) and return its result."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        try:
            os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        except BrokenPipeError:
            raise BrowserError(f"chromium exited ({self._process.poll()}); its log:\n{self._log()}") from None
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") != self._next_id:
                self._events.append(reply)
                continue
            if "error" in reply:
                raise BrowserError(f"{method}: {reply['error'].get('message')} ({reply['error']})")
            return reply.get("result", {})

    # --- what the tests use ---------------------------------------------------------

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable values)."""
        result = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"JavaScript failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str) -> None:
        """Navigate to ``url`` and wait until the page and what it loads are complete."""
        reply = self.call("Page.navigate", session=True, url=url)
        if reply.get("errorText"):
            raise BrowserError(f"cannot open {url}: {reply['errorText']}")
        deadline = time.monotonic() + self.timeout
        while self.evaluate("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise BrowserError(f"{url} did not finish loading within {self.timeout:.0f} s")
            time.sleep(0.05)

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page, not only the window, written to ``path``."""
        size = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        data = self.call(
            "Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True, clip=clip
        )["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except BrowserError:
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        for fd in (self._to_browser, self._from_browser):
            os.close(fd)
        self._stderr.close()
        self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
