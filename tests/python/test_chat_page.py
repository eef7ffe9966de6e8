"""The chat page of `porter serve` (GET /) in a real headless Chromium, driven over the DevTools
protocol (CDP) with websocket-client.

Run by runner/tests/chat_page.rs (`#[ignore]`d; .ci/run installs Debian's chromium and runs it)
with the test venv of scripts/test-setup.sh:
    target/smollm2-venv/bin/python tests/python/test_chat_page.py PORTER_BIN
Starts `porter serve` on the real SmolLM2-135M-Instruct (target/smollm2) with an API key on a
free loopback port, and `chromium --headless=new` on a free DevTools port. Fails (does not skip)
when chromium is missing. PORTER_SCREENSHOT=PATH saves a PNG of the scripted "Paris" exchange
(docs/chat-page.png is one). Every wait is bounded; Chromium and the server are always stopped.
"""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.request

import websocket

# test_serve takes PORTER_BIN off sys.argv when imported (the same command line as ours).
import test_serve
from test_serve import SMOLLM2, Server

KEY = "sekret"
QUESTION = "What is the capital of France?"
LONG = "Write a very long story about a dragon who learns to cook, at least two thousand words."


class Chromium:
    """A headless Chromium and a CDP session on its one page."""

    def __init__(self):
        exe = os.environ.get("PORTER_CHROMIUM") or shutil.which("chromium")
        if not exe:
            raise RuntimeError("chromium is not on PATH: apt-get install -y --no-install-recommends chromium")
        self.tmp = tempfile.mkdtemp(prefix="porter-chromium-")
        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--remote-debugging-port=0", f"--user-data-dir={self.tmp}", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             "--window-size=1000,700", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.ws = None
        self.next_id = 0
        self.log = []
        found = threading.Event()

        def drain():  # keeps the pipe empty for Chromium's whole life
            for line in self.proc.stderr:
                self.log.append(line)
                if line.startswith("DevTools listening on ws://"):
                    self.browser_ws = line.split(" on ", 1)[1].strip()
                    found.set()

        threading.Thread(target=drain, daemon=True).start()
        try:
            if not found.wait(60):
                raise RuntimeError("no 'DevTools listening on' line from chromium in 60 s:\n" + "".join(self.log))
            port = int(self.browser_ws.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                pages = [t for t in json.load(r) if t.get("type") == "page"]
            if not pages:
                raise RuntimeError("chromium has no page target")
            # No Origin header: Chromium refuses DevTools websockets from other origins.
            self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        except BaseException:
            self.close()
            raise

    def call(self, method, **params):
        """One CDP command; events in between are skipped."""
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        deadline = time.time() + 30
        while time.time() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
        raise TimeoutError(f"{method}: no answer in 30 s")

    def js(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expr, timeout, what):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = self.js(f"(() => {{ try {{ return ({expr}); }} catch (e) {{ return false; }} }})()")
            if v:
                return v
            time.sleep(0.05)
        raise AssertionError(f"{what}: not within {timeout} s; page: {self.js(STATE)}")

    def click(self, sel):
        """A real mouse click at the middle of the element."""
        x, y = self.js(f"(() => {{ const r = document.querySelector({json.dumps(sel)}).getBoundingClientRect();"
                       " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for t in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=t, x=x, y=y, button="left", clickCount=1)

    def type(self, sel, text):
        self.click(sel)
        self.call("Input.insertText", text=text)

    def set_value(self, sel, value, event="input"):
        self.js(f"(() => {{ const e = document.querySelector({json.dumps(sel)}); e.value = {json.dumps(value)};"
                f" e.dispatchEvent(new Event({json.dumps(event)})); }})()")

    def close(self):
        try:
            if self.ws is not None:
                self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            shutil.rmtree(self.tmp, ignore_errors=True)


# What a failed wait prints: the page's state.
STATE = """JSON.stringify({status: document.getElementById("status").dataset.state,
  text: document.getElementById("status").textContent, model: document.getElementById("model").textContent,
  stop: !document.getElementById("stop").hidden,
  messages: [...document.querySelectorAll("#messages .msg")].map(m => [m.className, m.textContent.slice(0, 80)])})"""
IDLE = ('document.getElementById("status").dataset.state === "idle" && document.getElementById("stop").hidden'
        ' && !document.getElementById("send").disabled')
LAST_REPLY = '[...document.querySelectorAll("#messages .msg.assistant")].map(m => m.textContent).pop() || ""'


class ChatPage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Server("--model", SMOLLM2, "--api-key", KEY, "--served-model-name", "smollm2")
        try:
            cls.b = Chromium()
        except BaseException:
            cls.s.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            cls.b.close()
        finally:
            assert cls.s.stop() == 0, "porter serve did not exit 0 on SIGTERM"

    def test_page_is_served_without_the_key(self):
        with urllib.request.urlopen(self.s.base + "/", timeout=10) as r:
            self.assertEqual(r.status, 200)
            self.assertEqual(r.headers["content-type"], "text/html; charset=utf-8")
            self.assertIn('id="messages"', r.read().decode())

    def test_scripted_exchange(self):
        b = self.b
        b.call("Emulation.setDeviceMetricsOverride", width=1000, height=700, deviceScaleFactor=1, mobile=False)
        b.call("Page.navigate", url=self.s.base + "/")
        b.wait_for(f'location.href === "{self.s.base}/" && document.readyState === "complete"', 30, "the page loaded")
        # Without the key /v1/models is a 401, shown in the page.
        b.wait_for('document.getElementById("status").dataset.state === "error"', 30, "the 401 shown")
        self.assertIn("API key", b.js('document.getElementById("status").textContent'))
        b.set_value("#api-key", KEY, "change")
        b.wait_for('document.getElementById("model").textContent === "smollm2"', 30, "the model name shown")
        b.wait_for(IDLE, 10, "idle")
        self.assertEqual(b.js('localStorage.getItem("porter.apiKey")'), KEY)

        # A greedy answer streamed into the page equals the API's non-streamed one.
        b.set_value("#temperature", "0")
        b.set_value("#max-tokens", "64")
        b.type("#input", QUESTION)
        b.click("#send")
        b.wait_for(IDLE, 60, "the first reply streamed")
        reply = b.js(LAST_REPLY)
        self.assertIn("Paris", reply)
        self.assertNotIn("<|im_end|>", reply)
        code, text = self.s.post("/v1/chat/completions",
                                 {"model": "smollm2", "messages": [{"role": "user", "content": QUESTION}],
                                  "temperature": 0, "max_tokens": 64}, {"authorization": "Bearer " + KEY})
        self.assertEqual(code, 200, text)
        self.assertEqual(reply, json.loads(text)["choices"][0]["message"]["content"])
        self.assertEqual(b.js('[...document.querySelectorAll("#messages .msg")].map(m => m.className)'),
                         ["msg user", "msg assistant"])
        if os.environ.get("PORTER_SCREENSHOT"):
            png = base64.b64decode(b.call("Page.captureScreenshot", format="png")["data"])
            with open(os.environ["PORTER_SCREENSHOT"], "wb") as f:
                f.write(png)

        # A server error (400 naming the field) is shown, and the turn is taken back.
        b.set_value("#max-tokens", str(10 ** 7))
        b.type("#input", "Hello")
        b.click("#send")
        b.wait_for('document.getElementById("status").dataset.state === "error"', 30, "the 400 shown")
        self.assertIn("max_tokens", b.js('document.querySelector("#messages .msg.error").textContent'))
        self.assertEqual(b.js('document.getElementById("input").value'), "Hello")
        self.assertEqual(b.js("turns.length"), 2)

        # Stop mid-stream: the page is idle again and the server frees the request.
        b.set_value("#input", "")
        b.set_value("#max-tokens", "3000")
        b.type("#input", LONG)
        b.click("#send")
        b.wait_for(LAST_REPLY + ".length >= 40", 60, "the long reply streaming")
        self.assertTrue(b.js('!document.getElementById("stop").hidden'))
        self.assertGreaterEqual(self.s.metric("vllm:num_requests_running"), 1)
        b.click("#stop")
        b.wait_for(IDLE, 10, "idle after Stop")
        self.assertEqual(b.js('document.getElementById("status").textContent'), "Stopped.")
        deadline = time.time() + 30
        while time.time() < deadline and self.s.metric("vllm:num_requests_running") > 0:
            time.sleep(0.05)
        self.assertEqual(self.s.metric("vllm:num_requests_running"), 0)
        # The conversation keeps the stopped reply: two exchanges, the second cut short.
        self.assertEqual(b.js("turns.map(t => t.role)"), ["user", "assistant", "user", "assistant"])
        self.assertEqual(b.js("turns[3].content"), b.js(LAST_REPLY))


if __name__ == "__main__":
    unittest.main(verbosity=2)
