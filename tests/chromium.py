"""Headless Chromium driven over the DevTools protocol through a pipe (--remote-debugging-pipe: JSON messages ended
by a NUL byte, commands on its fd 3, answers on its fd 4), with the standard library alone."""
import base64
import fcntl
import json
import os
import shutil
import subprocess
import time

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
         "--disable-background-networking", "--disable-component-update", "--remote-debugging-pipe"]


def find():
    """The Chromium binary, or None."""
    return next((shutil.which(name) for name in ("chromium", "chromium-browser") if shutil.which(name)), None)


class Browser:
    """One page of a headless Chromium: goto(url), js(expression) -> its value, wait(expression), screenshot(path)."""

    def __init__(self, binary, profile_dir, width=1200, height=1000):
        to_browser, self.writer = os.pipe()
        self.reader, from_browser = os.pipe()

        def pipes_at_3_and_4():  # in the child, before exec: high copies first, so that neither overwrites the other
            a, b = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser, from_browser))
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.process = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile_dir}", "about:blank"],
                                        preexec_fn=pipes_at_3_and_4, close_fds=False, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser)
        os.close(from_browser)
        self.buffer, self.next_id, self.session = b"", 0, None
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def send(self, method, **params):
        """One command; its result (events that arrive meanwhile are dropped)."""
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self.writer, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.buffer:
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
        result = self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression, timeout=60):
        """Poll until expression is truthy; its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(f"(() => {{ try {{ return {expression}; }} catch (e) {{ return null; }} }})()")
            if value:
                return value
            time.sleep(0.05)
        raise TimeoutError(f"waited {timeout} s for {expression}")

    def screenshot(self, path):
        shot = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))

    def close(self):
        self.process.kill()
        self.process.wait()
        os.close(self.writer)
        os.close(self.reader)
