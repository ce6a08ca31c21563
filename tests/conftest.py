"""Fixtures shared by the unit tests."""

import pytest
import torch.distributed as dist


@pytest.fixture
def one_process_group(tmp_path):
    """A Gloo process group of world size 1 in this process, destroyed afterwards."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
