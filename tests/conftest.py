"""Fixtures shared by the unit tests."""

import os
import shutil

import ipykernel.kernelspec
import pytest
import torch.distributed as dist
from demo_runs import PINGPONG_SIZES
from kernel_fork import kernel_spec
from suite_order import place

from course_lib.runtime import launch as launch_module
from course_lib.runtime.agent_client import SOCKET_ENV, start_shared_server
from course_lib.runtime.launch import launch

SHARED_SERVER = pytest.StashKey()


def pytest_configure(config):
    share_an_agent_server(config)
    fork_nbvals_kernels()


def share_an_agent_server(config) -> None:
    """With test processes (``-n``), every process of the session (the test processes, their
    notebook kernels, JupyterLab's) reaches one agent server, started here, instead of each
    importing torch for a server of its own: 5 s of CPU each (runtime/agent_client.py)."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    if launch_module.AGENT_SERVER:
        server, path = start_shared_server(launch_module.server_env())
        os.environ[SOCKET_ENV] = path  # the test processes inherit it, and pass it on
        config.stash[SHARED_SERVER] = server, path


def pytest_unconfigure(config):
    server, path = config.stash.get(SHARED_SERVER, (None, None))
    if server is not None:
        server.kill()
        server.wait()
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def fork_nbvals_kernels() -> None:
    """nbval's kernels (``--nbval-current-env``), like the tests' own, are forked from a
    process that imported torch once (tests/kernel_fork.py): 3 s of CPU saved per notebook."""
    try:
        from nbval import kernel as nbval_kernel
    except ImportError:
        return
    current_env = nbval_kernel.NbvalKernelspecManager.get_kernel_spec

    def get_kernel_spec(self, kernel_name):
        spec = kernel_spec() if kernel_name == nbval_kernel.CURRENT_ENV_KERNEL_NAME else None
        if spec is None:
            return current_env(self, kernel_name)
        return self.kernel_spec_class(resource_dir=ipykernel.kernelspec.RESOURCES, **spec)

    nbval_kernel.NbvalKernelspecManager.get_kernel_spec = get_kernel_spec


def pytest_collection_modifyitems(items):
    """The longest files first (tests/suite_order.py), for scripts/test.sh's test processes."""
    items.sort(key=lambda item: place(item.nodeid))  # stable: a file's tests keep their order


def pytest_ignore_collect(collection_path):
    """A notebook under tests/ is a test's input (the browser test's), not one for nbval."""
    if collection_path.suffix == ".ipynb":
        return True
    return None


@pytest.fixture(scope="session")
def tour_run():
    """Notebook 05's collectives tour on 4 processes, launched once for every test reading it."""
    return launch("course_lib.demos.collectives_tour", nproc=4, timeout_s=180, quiet=True)


@pytest.fixture(scope="session")
def ring_trace_run():
    """Notebook 06's ring trace (and ping-pong) on 4 processes, launched once per session."""
    return launch("course_lib.demos.ring_trace", nproc=4, timeout_s=180, quiet=True,
                  args=["--pingpong-sizes", *map(str, PINGPONG_SIZES)])


@pytest.fixture
def one_process_group(tmp_path):
    """A Gloo process group of world size 1 in this process, destroyed afterwards."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


class Workspace:
    """A learner's workspace/ folder in a temporary working directory."""

    def __init__(self, root):
        self.root = root

    def put(self, answer: str, as_name: str) -> str:
        """Write ``answer``, a file's text (``answer_edits.reference``, ``edited``, ...), to
        workspace/AS_NAME and return that path."""
        os.makedirs(self.root / "workspace", exist_ok=True)
        (self.root / "workspace" / as_name).write_text(answer)
        return f"workspace/{as_name}"


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """Work in ``tmp_path`` as a notebook works in its folder: ``workspace/`` lives there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COURSE_WORKSPACE", raising=False)
    return Workspace(tmp_path)
