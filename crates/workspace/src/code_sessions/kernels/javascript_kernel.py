"""microagent's JavaScript kernel: Jupyter's protocol through ipykernel,
the code run by one long-lived Node.js process.

microagent writes this file and its runner (MICROAGENT_JS_RUNNER) into
the guest for a `javascript` code session and starts it as
`python3 THIS_FILE -f CONNECTION_FILE`. Each execute_request's code goes
to node as one JSON line on its stdin; what the code prints comes back
as stream messages, then its outcome (the last expression's value, or
the error it threw) on a pipe of their own. An interrupt_request makes
ipykernel send SIGINT to its process group, node's too: the running code
throws (vm's breakOnSigint) and the session goes on.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

if shutil.which("node") is None:
    print("microagent: no node on PATH (Debian's nodejs)", file=sys.stderr)
    sys.exit(3)

from ipykernel.kernelapp import IPKernelApp  # noqa: E402
from ipykernel.kernelbase import Kernel  # noqa: E402

RUNNER = os.environ.get("MICROAGENT_JS_RUNNER", "")


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
        self.outcomes = None

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
        self.outcomes = os.fdopen(read, "rb")

    def forward_interrupt(self, signum, frame):
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
        try:
            self.node.stdin.write((json.dumps({"code": code}) + "\n").encode())
            self.node.stdin.flush()
        except OSError as e:
            return self.failed("NodeGone", "node did not take the code: %s" % e, [])
        previous = signal.signal(signal.SIGINT, self.forward_interrupt)
        try:
            outcome = None
            while outcome is None:
                line = self.outcomes.readline()
                if not line:
                    self.node.wait()
                    return self.failed(
                        "NodeGone", "node ended (status %s)" % self.node.returncode, []
                    )
                message = json.loads(line)
                kind = message.get("t")
                if kind in ("out", "err"):
                    self.stream("stdout" if kind == "out" else "stderr", message.get("s", ""))
                elif kind == "done":
                    outcome = message
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
