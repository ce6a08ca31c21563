"""The tests' own kernel (tests/notebook_kernel.py) leaves no process behind: the suite starts
one per notebook in several files, and a kernel left running holds its memory to the end."""

import os
import time

from notebook_kernel import fresh_kernel, stdout


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a child that ended but was not reaped yet counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_kernel_is_shut_down_when_the_block_ends(tmp_path):
    with fresh_kernel(tmp_path) as kernel:
        pid = int(stdout(kernel.run("import os\nprint(os.getpid())")))
        assert alive(pid)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid), f"the kernel (pid {pid}) still runs after the block"
