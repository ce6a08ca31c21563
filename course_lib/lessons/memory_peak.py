"""The peak of activation memory over a whole training step, accumulation included (notebook 03,
scripts/bench_memory.py).

``course_lib.lessons.memory.activation_bytes`` measures one forward pass. Under gradient
accumulation the question is different: how many activation bytes are alive *at the same time*
across k micro-steps? Each backward frees the graph of its micro-batch, so the peak should be
that of one micro-batch. :class:`SavedTensorPeak` measures it: every tensor autograd saves is
wrapped, its storage counted while any wrapper holds it, and the count drops when the graph
that saved it is freed.

    with SavedTensorPeak(exclude=model.parameters()) as peak:
        for micro in micro_batches:
            loss_of(micro).backward()
    peak.peak_bytes     # most activation bytes alive at once

On a GPU, ``cuda_step_peak`` reads the allocator's peak instead (activations and temporaries).
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from course_lib.lessons.memory import storage_key


class _Saved:
    """What autograd keeps instead of the tensor: the tensor plus a note in the ledger."""

    __slots__ = ("tensor", "key", "peak")

    def __init__(self, tensor: torch.Tensor, key: tuple, peak: "SavedTensorPeak"):
        self.tensor, self.key, self.peak = tensor, key, peak

    def __del__(self):  # the graph that saved it is gone
        self.peak._release(self.key)


class SavedTensorPeak:
    """Live and peak bytes of the storages autograd holds for backward (parameters excluded)."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self.skip = {storage_key(t) for t in exclude}
        self.holders: dict[tuple, int] = {}  # storage -> number of saved tensors that use it
        self.live_bytes = 0
        self.peak_bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor):
        key = storage_key(t)
        if key in self.skip:
            return t
        if self.holders.get(key, 0) == 0:
            self.live_bytes += key[3]  # a whole storage stays alive, not only the view
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.holders[key] = self.holders.get(key, 0) + 1
        return _Saved(t, key, self)

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Saved) else packed

    def _release(self, key: tuple) -> None:
        self.holders[key] -= 1
        if self.holders[key] == 0:
            del self.holders[key]
            self.live_bytes -= key[3]

    def __enter__(self) -> "SavedTensorPeak":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def cuda_step_peak(step: Callable[[], None], device: torch.device) -> int:
    """Peak bytes the CUDA allocator held above its starting point while ``step()`` ran."""
    torch.cuda.synchronize(device)
    start = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - start
