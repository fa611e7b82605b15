"""microagent's kernel server: ipykernel imported once, each kernel forked.

A kernel's start is mostly imports (ipykernel, IPython, zmq, tornado:
some 700 modules, ten thousand system calls and page faults), which cost
minutes where guest kernel mode is emulated. This process pays them once
per workspace (once per image where it is in a warm snapshot) and forks
a kernel for each request: a forked kernel only sets itself up.

microagent runs it as `python3 -c THIS PORT_FILE` (background process
`code-kernels`, as the workspace's user). It listens on the guest's
loopback and writes `{"port", "key", "pid"}` to PORT_FILE (0600, made
new). The host connects through the agent's tcp_connect and sends one
JSON line:

    {"key": KEY, "launcher": PID, "language": "python"|"javascript",
     "argv": [...], "env": {...}}

LAUNCHER is a background process the agent started for the kernel (a
`sleep` that ignores SIGINT), its group's leader: the forked kernel joins
that group and takes its stdout and stderr, so the agent's signals to
the process (KILL when a session ends) and its output reach the kernel.
The reply is `{"pid": N}` or `{"error": "..."}`. Only root (the agent)
and this user may ask; a request must come whole within 5 s. When the
kernel ends its launcher is killed, and when the launcher ends its group
is, so the two end together. The server answers one request at a time.
"""

import gc
import json
import os
import secrets
import select
import signal
import socket
import sys
import time

# As ipykernel_launcher: the start's directory is not on the path.
if sys.path and sys.path[0] == "":
    del sys.path[0]
# Without the debugger (debugpy: some 270 modules and a `uname` process;
# ipykernel says "debugging will not be enabled") and jedi's completions
# (some 100 modules): both importable again by the session's own code.
sys.modules["debugpy"] = None
sys.modules["jedi"] = None
from ipykernel import ipkernel, kernelapp, kernelbase  # noqa: E402,F401
import IPython.core.completer  # noqa: E402,F401

del sys.modules["debugpy"], sys.modules["jedi"]
# What was imported stays out of the collector's way: a forked kernel's
# collections would otherwise write to every object, one copied page each.
gc.collect()
gc.freeze()

# A request is one line of at most this many bytes,
MAX_REQUEST = 64 * 1024
# sent whole within this many seconds.
REQUEST_SECONDS = 5
# Kernels at once (a workspace has at most 8 sessions, and kernels made
# ahead).
MAX_KERNELS = 64
# The highest pid Linux gives.
MAX_PID = 1 << 22


def fail(conn, why):
    try:
        conn.sendall((json.dumps({"error": why}) + "\n").encode())
    except OSError:
        pass


def peer_uid(conn):
    """The uid of the socket at the connection's other end on loopback
    (its line in /proc/net/tcp), or None."""
    here = ":%04X" % conn.getsockname()[1]
    there = ":%04X" % conn.getpeername()[1]
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            if len(fields) > 7 and fields[1].endswith(there) and fields[2].endswith(here):
                return int(fields[7])
    return None


def read_request(conn):
    deadline = time.monotonic() + REQUEST_SECONDS
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ValueError("the request took over %d s" % REQUEST_SECONDS)
        conn.settimeout(left)
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            raise ValueError("the request is over %d bytes" % MAX_REQUEST)
    request = json.loads(data.split(b"\n", 1)[0])
    if not isinstance(request, dict):
        raise ValueError("the request is not an object")
    return request


def checked(request, key, in_use):
    """The request's launcher, language, argv and env, once sound."""
    given = request.get("key")
    if not isinstance(given, str) or not secrets.compare_digest(
            given.encode("utf-8", "surrogatepass"), key.encode()):
        raise PermissionError("wrong key")
    launcher = request.get("launcher")
    if not isinstance(launcher, int) or not 1 < launcher < MAX_PID or launcher == os.getpid():
        raise ValueError("no launcher pid")
    if launcher in in_use:
        raise ValueError("the launcher has a kernel")
    language = request.get("language")
    if language not in ("python", "javascript"):
        raise ValueError("unknown language")
    argv = request.get("argv")
    env = request.get("env", {})
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        raise ValueError("argv is not a list of strings")
    if not (isinstance(env, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise ValueError("env is not a map of strings")
    if language == "javascript" and not argv:
        raise ValueError("no kernel file for javascript")
    # Only a group leader of this user, so that its group is the agent's
    # process: the kernel joins it.
    if os.getpgid(launcher) != launcher:
        raise ValueError("the launcher leads no process group")
    if os.stat("/proc/%d" % launcher).st_uid != os.getuid():
        raise PermissionError("the launcher is another user's")
    return launcher, language, argv, env


def become_kernel(listener, conn, launcher, language, argv, env):
    """In the forked child: join the launcher's group, take its output,
    and run the kernel; never returns."""
    status = 1
    try:
        listener.close()
        conn.close()
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        os.setpgid(0, launcher)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        for fd in (1, 2):
            out = os.open("/proc/%d/fd/%d" % (launcher, fd), os.O_WRONLY)
            os.dup2(out, fd)
            os.close(out)
        os.close(null)
        os.environ.update(env)
        if language == "python":
            sys.argv = ["ipykernel"] + argv
            kernelapp.launch_new_instance(argv=argv)
        else:
            import runpy

            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 1
    except BaseException as e:  # noqa: BLE001: told on stderr, then ended
        try:
            print("microagent: the kernel failed: %r" % (e,), file=sys.stderr)
        except BaseException:  # noqa: BLE001
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def main():
    if len(sys.argv) != 2:
        print("usage: kernel_server PORT_FILE", file=sys.stderr)
        sys.exit(2)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    key = secrets.token_hex(32)
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"port": listener.getsockname()[1], "key": key, "pid": os.getpid()}, f)
    print("microagent: kernel server ready", file=sys.stderr, flush=True)
    # Each kernel's pidfd and its launcher's, both ways.
    kernels = {}  # kernel pidfd -> (launcher pidfd, kernel pid)
    launchers = {}  # launcher pidfd -> (kernel pidfd, launcher pid)
    while True:
        ready, _, _ = select.select([listener] + list(kernels) + list(launchers), [], [])
        for fd in ready:
            if fd in kernels:
                launcher_fd, pid = kernels.pop(fd)
                os.waitpid(pid, 0)
                os.close(fd)
                launchers.pop(launcher_fd, None)
                try:
                    signal.pidfd_send_signal(launcher_fd, signal.SIGKILL)
                except OSError:
                    pass
                os.close(launcher_fd)
            elif fd in launchers:
                kernel_fd, launcher = launchers.pop(fd)
                try:
                    # The kernel, not reaped yet, still holds the group's
                    # id: it names no other processes.
                    os.killpg(launcher, signal.SIGKILL)
                except OSError:
                    pass
                try:
                    signal.pidfd_send_signal(kernel_fd, signal.SIGKILL)
                except OSError:
                    pass
            elif fd is listener:
                conn, _ = listener.accept()
                with conn:
                    try:
                        # Only the agent (root: the host's tcp_connect)
                        # and this user, before a byte is read.
                        if peer_uid(conn) not in (0, os.getuid()):
                            raise PermissionError("not a client of this user")
                        if len(kernels) >= MAX_KERNELS:
                            raise ValueError("%d kernels run already" % MAX_KERNELS)
                        in_use = [launcher for _, launcher in launchers.values()]
                        request = read_request(conn)
                        launcher, language, argv, env = checked(request, key, in_use)
                        launcher_fd = os.pidfd_open(launcher)
                    except Exception as e:  # noqa: BLE001: refused, the server goes on
                        fail(conn, str(e)[:200] or type(e).__name__)
                        continue
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        for inherited in list(kernels) + list(launchers) + [launcher_fd]:
                            os.close(inherited)
                        become_kernel(listener, conn, launcher, language, argv, env)
                    kernel_fd = os.pidfd_open(pid)
                    kernels[kernel_fd] = (launcher_fd, pid)
                    launchers[launcher_fd] = (kernel_fd, launcher)
                    try:
                        conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
                    except OSError:
                        pass


if __name__ == "__main__":
    main()
