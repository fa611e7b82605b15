"""microagent's JavaScript kernel: Jupyter's protocol through ipykernel,
the code run by one long-lived Node.js process.

microagent writes this file and its runner (MICROAGENT_JS_RUNNER) into
the guest for a `javascript` code session, and its kernel server
(kernel_server.py) runs it in a forked child as
`THIS_FILE -f CONNECTION_FILE`. Each execute_request's code goes
to node as one JSON line on its stdin; what the code prints comes back
as stream messages, then its outcome (the last expression's value, or
the error it threw) on a pipe of their own. An interrupt_request makes
ipykernel send SIGINT to its process group, node's too: the running code
throws (vm's breakOnSigint) and the session goes on.
"""

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

if shutil.which("node") is None:
    print("microagent: no node on PATH (Debian's nodejs)", file=sys.stderr)
    sys.exit(3)

# Imported already by the kernel server that forks this kernel.
from ipykernel.kernelapp import IPKernelApp  # noqa: E402
from ipykernel.kernelbase import Kernel  # noqa: E402

RUNNER = os.environ.get("MICROAGENT_JS_RUNNER", "")
# How long node may take to stop at an interrupt before it is killed (code
# that never yields: a loop in a callback or after an await).
INTERRUPT_GRACE = 3.0
# Messages kept while no cell reads them (what timers print between cells).
MAX_WAITING = 4096


def read_messages(pipe, messages):
    """Puts each line node sends on `messages` (one that is not JSON as
    text on stderr), then None at its end."""
    for line in pipe:
        try:
            message = json.loads(line)
            if not isinstance(message, dict):
                raise ValueError("not an object")
        except ValueError:
            message = {"t": "err", "s": line.decode("utf-8", "replace")}
        # Printed between cells and never read: the oldest is kept, the
        # rest dropped, so a chatty timer cannot fill the guest's memory.
        if message.get("t") != "done" and messages.qsize() > MAX_WAITING:
            continue
        messages.put(message)
    messages.put(None)


def gone(why):
    return {"ok": False, "name": "NodeGone", "message": why}


def node_version():
    try:
        out = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=60)
        return out.stdout.strip().lstrip("v")
    except (OSError, subprocess.SubprocessError):
        return ""


class JavaScriptKernel(Kernel):
    implementation = "microagent-javascript"
    implementation_version = "1"
    language = "javascript"
    language_version = node_version()
    language_info = {
        "name": "javascript",
        "version": language_version,
        "mimetype": "application/javascript",
        "file_extension": ".js",
    }
    banner = "JavaScript (Node.js " + language_version + ") through microagent"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.node = None
        self.messages = None
        self.interrupted_at = None

    def start_node(self):
        read, write = os.pipe()
        # Its stdout and stderr are this process's: the runner sends what
        # the code prints on the outcome pipe itself.
        self.node = subprocess.Popen(
            ["node", RUNNER, str(write)],
            stdin=subprocess.PIPE,
            pass_fds=(write,),
        )
        os.close(write)
        # Read all the time, so that output printed between cells never
        # fills the pipe and stops node; None is its end.
        self.messages = queue.Queue()
        threading.Thread(
            target=read_messages, args=(os.fdopen(read, "rb"), self.messages), daemon=True
        ).start()

    def forward_interrupt(self, signum, frame):
        self.interrupted_at = time.monotonic()
        # ipykernel signals its process group when it leads one, which
        # reaches node; otherwise only this process hears it.
        if self.node is not None and os.getpgid(0) != os.getpid():
            try:
                self.node.send_signal(signal.SIGINT)
            except OSError:
                pass

    def do_execute(
        self, code, silent, store_history=True, user_expressions=None, allow_stdin=False
    ):
        if self.node is None or self.node.poll() is not None:
            ended = None if self.node is None else self.node.returncode
            self.start_node()
            if ended is not None:
                self.stream("stderr", "microagent: node had ended (status %s): a new one runs; "
                            "what was defined before is gone\n" % ended)
        self.interrupted_at = None
        previous = signal.signal(signal.SIGINT, self.forward_interrupt)
        try:
            outcome = self.send_and_wait(code)
        finally:
            signal.signal(signal.SIGINT, previous)
        if not outcome.get("ok"):
            return self.failed(
                outcome.get("name") or "Error",
                outcome.get("message") or "",
                (outcome.get("stack") or "").splitlines(),
            )
        value = outcome.get("value")
        if value is not None:
            self.send_response(
                self.iopub_socket,
                "execute_result",
                {
                    "execution_count": self.execution_count,
                    "data": {"text/plain": value},
                    "metadata": {},
                },
            )
        return {
            "status": "ok",
            "execution_count": self.execution_count,
            "payload": [],
            "user_expressions": {},
        }

    def send_and_wait(self, code):
        """Sends the cell to node and passes on what it prints until its
        outcome: node's, or one said here when node ends, or does not stop
        within INTERRUPT_GRACE of an interrupt (then it is killed)."""
        try:
            self.node.stdin.write((json.dumps({"code": code}) + "\n").encode())
            self.node.stdin.flush()
        except OSError as e:
            return gone("node did not take the code: %s" % e)
        while True:
            try:
                message = self.messages.get(timeout=0.25)
            except queue.Empty:
                if self.node.poll() is not None and self.messages.empty():
                    return gone("node ended (status %s)" % self.node.returncode)
                late = self.interrupted_at is not None and (
                    time.monotonic() - self.interrupted_at > INTERRUPT_GRACE
                )
                if late:
                    self.node.kill()
                    self.node.wait()
                    return {
                        "ok": False,
                        "name": "Interrupted",
                        "message": "node did not stop at the interrupt and was killed: "
                        "what the session defined is gone",
                    }
                continue
            if message is None:
                self.node.wait()
                return gone("node ended (status %s)" % self.node.returncode)
            kind = message.get("t")
            if kind in ("out", "err"):
                self.stream("stdout" if kind == "out" else "stderr", message.get("s", ""))
            elif kind == "done":
                return message

    def stream(self, name, text):
        self.send_response(self.iopub_socket, "stream", {"name": name, "text": text})

    def failed(self, name, value, traceback):
        content = {"ename": name, "evalue": value, "traceback": traceback}
        self.send_response(self.iopub_socket, "error", content)
        return dict(content, status="error", execution_count=self.execution_count)

    def do_shutdown(self, restart):
        if self.node is not None and self.node.poll() is None:
            self.node.kill()
            self.node.wait()
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=JavaScriptKernel)
