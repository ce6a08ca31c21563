"""A fresh Jupyter kernel of this environment that runs code cells one at a time, and one kernel
reused for many runs, each begun as in a fresh kernel (``ReusedKernel``)."""

from __future__ import annotations

import json
import subprocess
from contextlib import ExitStack, contextmanager
from pathlib import Path

import ipykernel.kernelspec
import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync
from kernel_fork import kernel_spec
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

CELL_TIMEOUT_S = 600


class CurrentEnvironmentKernels(KernelSpecManager):
    """Every kernel name means ipykernel on this interpreter (as nbval --nbval-current-env),
    forked from a process that imported torch once where it can be (tests/kernel_fork.py)."""

    def get_kernel_spec(self, kernel_name):
        spec = kernel_spec() or ipykernel.kernelspec.get_kernel_dict()
        return self.kernel_spec_class(resource_dir=ipykernel.kernelspec.RESOURCES, **spec)


class Kernel:
    """Runs cells in one kernel; a cell that fails (an error reply) does not stop the next."""

    def __init__(self, client: NotebookClient):
        self.client = client

    def run(self, source: str) -> nbformat.NotebookNode:
        """Run ``source`` as a new cell; return the cell, with ``cell.failed`` set."""
        cell = nbformat.v4.new_code_cell(source)
        self.client.nb.cells.append(cell)
        try:
            self.client.execute_cell(cell, len(self.client.nb.cells) - 1)
            cell.failed = False
        except CellExecutionError:  # the kernel replied "error": Run All would stop here
            cell.failed = True
        return cell


@contextmanager
def fresh_kernel(folder: Path):
    """A new kernel whose working folder is ``folder``, shut down afterwards."""
    # asynchronous: while nbclient waits for a cell's messages it looks every second whether the
    # kernel still runs, and a kernel that died fails the cell (with a blocking manager the
    # wait blocks that look too, and a dead kernel hangs the cell)
    km = AsyncKernelManager(kernel_name="python3",
                            kernel_spec_manager=CurrentEnvironmentKernels())
    client = NotebookClient(nbformat.v4.new_notebook(), km=km, timeout=CELL_TIMEOUT_S,
                            allow_errors=False, resources={"metadata": {"path": str(folder)}})
    # cleanup_kc: shut the kernel down afterwards (nbclient keeps alive a kernel whose manager
    # it was given, and a test would leave one kernel running per notebook)
    with client.setup_kernel(stderr=subprocess.DEVNULL, cleanup_kc=True):  # no kernel log
        yield Kernel(client)


# how a run begins: the modules imported from the folder of the run before dropped (a kernel
# of its own never saw them), the new folder, the environment the kernel started with,
# ``forget`` (what a library holds in memory), then no names at all
BEGIN_RUN = """\
import os, sys
for name in [n for n, m in list(sys.modules.items())
             if (getattr(m, "__dict__", {{}}).get("__file__") or "").startswith({left!r})]:
    del sys.modules[name]
os.chdir({folder!r})
os.environ.clear()
os.environ.update({environ!r})
{forget}
%reset -f"""


class ReusedKernel:
    """One kernel for many runs (starting one costs seconds of CPU). Each ``run_in(folder)``
    begins as in a kernel just started in ``folder``, for what its cells can see: no names
    (``%reset -f``), ``folder`` as the working directory ('' on ``sys.path`` follows it), the
    environment the kernel started with (a variable a run set is gone), no module imported
    from the folder before, and whatever ``forget`` resets. Imported modules stay imported.

    A run that raised (a failed assertion, a cell past its timeout, a dead kernel) shuts the
    kernel down, and the next run starts a new one: no run inherits a broken kernel."""

    def __init__(self, home: Path, forget: str = ""):
        self.home, self.forget = Path(home), forget  # home: where a new kernel starts
        self.stack, self.kernel, self.environ, self.left = ExitStack(), None, {}, self.home

    @contextmanager
    def run_in(self, folder: Path):
        """The kernel, begun afresh in ``folder``; shut down if the block raises."""
        if self.kernel is None or not run_sync(self.kernel.client.km.is_alive)():
            self.close()
            self.start()
        begin = BEGIN_RUN.format(left=f"{self.left.resolve()}/", folder=str(folder),
                                 environ=self.environ, forget=self.forget)
        try:
            began = self.kernel.run(begin)
            assert not began.failed, f"the kernel could not begin a run: {errors(began)}"
            self.left = Path(folder)
            yield self.kernel
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        """A new kernel in ``home``; its environment, as every run begins with it."""
        self.kernel = self.stack.enter_context(fresh_kernel(self.home))
        shown = self.kernel.run("import json, os\nprint(json.dumps(dict(os.environ)))")
        self.environ = json.loads(stdout(shown))

    def close(self) -> None:
        """Shut the kernel down, if one runs."""
        self.kernel, self.left = None, self.home
        self.stack.close()


def stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")


def errors(cell) -> list:
    return [o for o in cell.outputs if o.output_type == "error"]
