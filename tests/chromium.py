"""Headless Chromium driven over the DevTools protocol through a pipe (--remote-debugging-pipe: JSON
messages ended by a NUL byte, commands on its fd 3, answers on its fd 4), with the standard library
alone."""

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import time

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-sync",
    "--disable-background-networking",
    "--disable-component-update",
    "--remote-debugging-pipe",
]


def find():
    """The Chromium binary, or None."""
    return next(
        (shutil.which(name) for name in ("chromium", "chromium-browser") if shutil.which(name)),
        None,
    )


class Browser:
    """One page of a headless Chromium: goto(url), js(expression) -> its value, wait(expression),
    screenshot(path)."""

    def __init__(self, binary, profile_dir, width=1200, height=1000):
        # our ends of the two pipes, and Chromium's, numbered from 10 up so that moving them to 3
        # and 4 overwrites none
        def high(fd):
            return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)

        to_browser, self.writer = map(high, os.pipe())
        self.reader, from_browser = map(high, os.pipe())
        actions = [(os.POSIX_SPAWN_DUP2, to_browser, 3), (os.POSIX_SPAWN_DUP2, from_browser, 4)] + [
            (os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)
        ]
        # posix_spawn, not fork: no Python runs in the child of a process whose other threads may
        # hold its locks
        self.pid = os.posix_spawn(
            binary,
            [binary, *FLAGS, f"--user-data-dir={profile_dir}", "about:blank"],
            os.environ,
            file_actions=actions,
        )
        os.close(to_browser)
        os.close(from_browser)
        self.buffer, self.next_id, self.session = b"", 0, None
        try:
            target = self.send("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)[
                "sessionId"
            ]
            self.send(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
        except BaseException:
            self.close()
            raise

    def send(self, method, timeout=60, **params):
        """One command; its result (events that arrive meanwhile are dropped)."""
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self.writer, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" not in self.buffer:
                if not select.select([self.reader], [], [], max(0.0, deadline - time.monotonic()))[
                    0
                ]:
                    raise TimeoutError(f"Chromium did not answer {method} within {timeout} s")
                chunk = os.read(self.reader, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed its pipe")
                self.buffer += chunk
            line, self.buffer = self.buffer.split(b"\0", 1)
            answer = json.loads(line)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]

    def goto(self, url):
        self.send("Page.navigate", url=url)

    def js(self, expression):
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.send(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression, timeout=60):
        """Poll until expression is truthy; its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = self.js(
                    f"(() => {{ try {{ return {expression}; }} catch (e) {{ return null; }} }})()"
                )
            except RuntimeError:  # the page is between two documents (navigating)
                value = None
            if value:
                return value
            time.sleep(0.05)
        raise TimeoutError(f"waited {timeout} s for {expression}")

    def screenshot(self, path):
        shot = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))

    def close(self):
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.writer)
        os.close(self.reader)
