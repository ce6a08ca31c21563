"""Kernels for the tests, forked from a process that imported torch once (Linux).

Starting a Jupyter kernel and importing torch, matplotlib and ipykernel in it costs 3-4 s of
CPU, and the suite starts a kernel for every notebook (nbval) and for the student copies. A
test process's first kernel starts one server, which imports torch and ipykernel once; the
kernel spec (``kernel_spec``) then starts each kernel as this file run as a script, a client:
it hands the server its standard streams, working folder, environment and the kernel's
arguments, and the server forks a child that runs ipykernel exactly as ``python -m
ipykernel_launcher`` would, in a session of its own. The client stands in for the kernel's
process: it passes on the signals Jupyter sends it (an interrupt, a shutdown) and ends when the
kernel ends; the kernel ends within a second when the client is killed, and the server ends
with the test process that started it.

What a forked kernel shares with the server is only what importing those modules did, before
any cell ran; each notebook still starts from no names, seeds its generators in its first cell,
and gets its own environment and folder. ``COURSE_TEST_FRESH_KERNELS=1`` starts every kernel as
a new interpreter instead.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

SOCKET_ENV = "COURSE_KERNEL_FORK_SOCKET"  # where a test process's server listens
FRESH_ENV = "COURSE_TEST_FRESH_KERNELS"
# matplotlib reads $MPLBACKEND when it is imported, before a kernel sets it: the server imports
# it without one, and each kernel sets the backend as importing it then would (use_backend)
# torch._dynamo: what torch's optimizers import at their first step, 1.7 s of CPU in each kernel
PRELOAD = ("torch", "ipykernel.kernelapp", "matplotlib.pyplot", "torch._dynamo")
INLINE = "module://matplotlib_inline.backend_inline"  # what ipykernel sets when none is set
WATCH_S = 0.2  # how often a forked kernel looks whether its client still runs


# ---- the client: what Jupyter starts as the kernel ---------------------------------------------

def client(argv: list[str]) -> int:
    """Ask the server for a kernel with ``argv`` (ipykernel's), then stand in for it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(os.environ[SOCKET_ENV])
        request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ),
                   "client": os.getpid()}
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
        conn.shutdown(socket.SHUT_WR)
        kernel = int(conn.makefile().read())

    def forward(signum, frame):
        try:
            os.kill(kernel, signum)
        except ProcessLookupError:
            pass
        if signum != signal.SIGINT:  # an interrupt stops a cell; the others end the kernel
            time.sleep(0.5)
            sys.exit(0)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, forward)
    while alive(kernel):
        time.sleep(0.05)
    return 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---- the server ---------------------------------------------------------------------------------

def serve(path: str) -> None:
    """Import the heavy modules once, then fork a kernel for each client that connects."""
    from course_lib.runtime.launch_child import die_with_parent

    die_with_parent()
    for name in PRELOAD:
        __import__(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # ended kernels are reaped at once
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(8)
        print("ready", flush=True)
        while True:
            conn, _ = listener.accept()
            with conn:
                message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                while chunk := conn.recv(1 << 20):
                    message += chunk
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    conn.close()  # the client reads until the server's side closes
                    run_kernel(json.loads(message), fds)
                for fd in fds:
                    os.close(fd)
                conn.sendall(str(pid).encode())


def run_kernel(request: dict, fds: list[int]) -> None:
    """In the forked child: the client's streams, folder and environment, then ipykernel."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the kernel waits for its own children
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["ipykernel_launcher", *request["argv"]]
        sys.path[0] = ""  # as for python -m ipykernel_launcher: the working folder first
        use_backend(os.environ.get("MPLBACKEND") or INLINE)
        watch(request["client"])
        from ipykernel import kernelapp

        kernelapp.launch_new_instance(argv=request["argv"])
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(0)


def use_backend(name: str) -> None:
    """The backend matplotlib would take from $MPLBACKEND had the kernel imported it (the
    server imported it earlier, with no $MPLBACKEND): set before any figure, as there."""
    import matplotlib

    matplotlib.rcParams["backend"] = name


def watch(client_pid: int) -> None:
    """End this kernel when its client is gone (killed: it could pass nothing on)."""
    import threading

    def look() -> None:
        while alive(client_pid):
            time.sleep(WATCH_S)
        os._exit(1)

    threading.Thread(target=look, name="client-watch", daemon=True).start()


# ---- what the tests use ------------------------------------------------------------------------

_server: list = []  # this test process's server, once started (or None: it could not start)


def start_server():
    """This test process's server, started on the first call (Linux, unless
    ``$COURSE_TEST_FRESH_KERNELS`` is 1); ``$COURSE_KERNEL_FORK_SOCKET`` tells the kernels'
    clients where it listens. None where it cannot run."""
    import subprocess
    import tempfile

    if _server:
        return _server[0]
    server = None
    if sys.platform.startswith("linux") and os.environ.get(FRESH_ENV) != "1":
        path = os.path.join(tempfile.mkdtemp(prefix="kernel-fork-"), "server.sock")
        server = subprocess.Popen([sys.executable, __file__, "--serve", path],
                                  stdout=subprocess.PIPE, text=True)
        if server.stdout.readline().strip() == "ready":
            os.environ[SOCKET_ENV] = path
        else:
            server.kill()
            server = None
    _server.append(server)
    return server


def kernel_spec() -> dict | None:
    """The kernel.json of a forked kernel (the server started if need be), or None."""
    if start_server() is None:
        return None
    return {"argv": [sys.executable, __file__, "-f", "{connection_file}"],
            "display_name": "Python 3 (forked)", "language": "python",
            "metadata": {"debugger": False}}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        sys.exit(client(sys.argv[1:]))
