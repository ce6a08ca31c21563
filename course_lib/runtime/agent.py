"""torchrun's agent, run in this process, tied to the life of its parent (notebook 00 on).

``run_agent(TORCHRUN_ARGS)`` is what ``python -m course_lib.runtime.launch_child agent`` runs,
and what the agent server's forked agents run (``agent_server.py``); ``die_with_parent`` and
``default_signal_handlers`` are what every process the launcher starts does first (the agent,
the server, each rank: ``launch_child.py``). Neither of those two modules imports the other:
what both need is here.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # Linux prctl option: signal this process when its parent dies
PRELOAD_ENV = "COURSE_PRELOAD"
# What every rank that builds an optimizer or DDP imports (torch's optimizers import
# torch._dynamo when the first one is made): 2 s of CPU per rank, paid once by the agent server.
PRELOAD = ("torch._dynamo",)


def die_with_parent() -> None:
    """Exit as soon as the parent process goes away (Linux: at once; elsewhere: within 0.5 s)."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent or parent == 1:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def forks_ranks(torchrun_args: list[str]) -> bool:
    """Whether torchrun will fork the ranks from this process (``--start-method fork``)."""
    return any(a == "--start-method" and b == "fork"
               for a, b in zip(torchrun_args, torchrun_args[1:], strict=False))


def preload_modules() -> list[str]:
    """Import the modules ``COURSE_PRELOAD`` names, once, here in the agent; return their names.
    A module imported here costs its CPU once, not once per rank.

    Ranks forked after the agent had imported ``torch._dynamo`` used to hang now and then on
    their way out (3 of 22 launches of ``demos/ddp_minimal.py``): a Gloo process group
    destroyed while one of its threads waits for the GIL. ``keep_process_groups`` removes
    that cause; ``tests/test_launch.py`` launches ddp_minimal again and again to hold it.
    """
    names = [n.strip() for n in os.environ.get(PRELOAD_ENV, "").split(",") if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            sys.exit(f"{PRELOAD_ENV} names {name!r}, which cannot be imported ({e}); "
                     f"correct or remove it")
    return names


def default_signal_handlers() -> None:
    """A rank forked from torchrun's agent inherits the agent's handlers (SIGTERM raising an
    exception, ...); give it a fresh interpreter's, so that a signal ends it the same way."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def name_rendezvous_steps_cheaply() -> None:
    """torchrun's rendezvous names each step it records after the method that took it, with
    ``inspect.stack()``: that reads the source of every frame on the stack and searches
    ``sys.modules`` for each, 18 times a launch, about 0.35 s of CPU (most of a forked
    agent's). Read the same name from the frame itself."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    def get_method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name  # frame 0 is this one, as in torch's
        except ValueError:  # the stack is not that deep
            return "no_method_name"

    if hasattr(dynamic_rendezvous, "get_method_name"):  # a torch without it keeps its own way
        dynamic_rendezvous.get_method_name = get_method_name


def run_agent(torchrun_args: list[str]) -> None:
    """Run torchrun's agent in this process."""
    die_with_parent()
    from torch.distributed.run import main

    name_rendezvous_steps_cheaply()

    if forks_ranks(torchrun_args):
        preload_modules()  # the ranks inherit them; fresh interpreters would not

    main(torchrun_args)
