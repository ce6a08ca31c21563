"""A fresh Jupyter kernel of this environment that runs code cells one at a time."""

from __future__ import annotations

import subprocess
from contextlib import contextmanager
from pathlib import Path

import ipykernel.kernelspec
import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

CELL_TIMEOUT_S = 600


class CurrentEnvironmentKernels(KernelSpecManager):
    """Every kernel name means ipykernel on this interpreter (as nbval --nbval-current-env)."""

    def get_kernel_spec(self, kernel_name):
        return self.kernel_spec_class(resource_dir=ipykernel.kernelspec.RESOURCES,
                                      **ipykernel.kernelspec.get_kernel_dict())


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
    km = KernelManager(kernel_name="python3", kernel_spec_manager=CurrentEnvironmentKernels())
    client = NotebookClient(nbformat.v4.new_notebook(), km=km, timeout=CELL_TIMEOUT_S,
                            allow_errors=False, resources={"metadata": {"path": str(folder)}})
    # cleanup_kc: shut the kernel down afterwards (nbclient keeps alive a kernel whose manager
    # it was given, and a test would leave one kernel running per notebook)
    with client.setup_kernel(stderr=subprocess.DEVNULL, cleanup_kc=True):  # no kernel log
        yield Kernel(client)


def stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")


def errors(cell) -> list:
    return [o for o in cell.outputs if o.output_type == "error"]
