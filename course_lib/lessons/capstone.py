"""The capstone (notebook 11): reach a target loss at a fixed global batch, within a memory
budget per process, by choosing processes, accumulation steps and micro-batch.

    from course_lib.lessons.capstone import Challenge, Split, memory_per_process, run_split
    challenge = Challenge()          # global batch 32, 1024 KiB per process, final loss < 1.75
    memory_per_process(8)            # bytes: parameters, gradients, optimizer state, activations
    problems_before_training(Split(2, 2, 8), challenge)   # [] when the split may run
    run = run_split(Split(2, 2, 8), challenge)            # python -m course_lib.train, launched

Memory is measured as in notebook 02, on the CPU, so every machine gets the same numbers: the
parameters, their gradients and AdamW's state after one real step, plus the activations that
autograd saves for one micro-batch (``course_lib.lessons.memory``, saved-tensor hooks). Only one
micro-batch's activations are alive at a time: each backward frees its graph (notebook 03).
torch DDP also keeps gradient buckets, about one more copy of the gradients; the challenge
counts the four kinds that notebook 02 measured.

The run goes through the training entry point, ``python -m course_lib.train`` with
``--nproc``-many processes started by ``course_lib.runtime.launch``; its ``--metrics`` file is read
back and the mean loss of the last ``window`` steps is judged.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from course_lib.core.accumulation import sum_token_loss
from course_lib.lessons.memory import memory_breakdown
from course_lib.runtime.launch import launch
from course_lib.tasks.batching import divisors
from course_lib.tasks.models import TransformerConfig, make_transformer
from course_lib.tasks.sequences import VOCAB, global_batch, input_length
from course_lib.train.config import TrainConfig

KIB = 1024  # bytes in a KiB
PARTS = ("parameters", "gradients", "optimizer state", "activations")


@dataclass(frozen=True)
class Challenge:
    """The rules. Everything but the split is fixed, so runs can be compared."""

    global_batch: int = 32  # examples per optimizer step, however they are split
    budget_kib: int = 1024  # memory each process may use, in KiB (1 MiB)
    target_loss: float = 1.75  # the final loss must end below this
    window: int = 10  # final loss = mean loss of the last `window` steps (one step is noisy)
    steps: int = 100  # optimizer steps of the run
    lr: float = 3e-3  # peak learning rate, after the trainer's linear warmup
    seed: int = 0  # the model's weights and every batch come from it
    max_nproc: int = 4  # processes allowed; a laptop has a few cores

    @property
    def budget_bytes(self) -> int:
        return self.budget_kib * KIB


@dataclass(frozen=True)
class Split:
    """How one optimizer step's examples are shared out: nproc x accum_steps x micro_batch."""

    nproc: int  # processes (ranks), each with a full copy of the model
    accum_steps: int  # micro-steps (forward + backward) per optimizer step, on each process
    micro_batch: int  # examples in one micro-step

    @property
    def global_batch(self) -> int:
        return self.nproc * self.accum_steps * self.micro_batch

    def __str__(self) -> str:
        return f"{self.nproc} x {self.accum_steps} x {self.micro_batch}"


def as_split(choice: Any) -> Split:
    """A Split from a Split, an (nproc, accum_steps, micro_batch) tuple or a dict of them."""
    if isinstance(choice, dict):
        choice = Split(**choice)
    elif isinstance(choice, (tuple, list)) and len(choice) == 3:
        choice = Split(*choice)
    if not isinstance(choice, Split):
        raise TypeError(f"expected Split(nproc, accum_steps, micro_batch) or a tuple of three "
                        f"whole numbers, got {choice!r}")
    for name in ("nproc", "accum_steps", "micro_batch"):
        value = getattr(choice, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return choice


def trainer_model(config: TrainConfig | None = None) -> torch.nn.Module:
    """The model ``course_lib.train`` builds, on the CPU in float32."""
    c = config or TrainConfig()
    shape = TransformerConfig(len(VOCAB), input_length(c.max_digits), c.d_model, c.n_heads,
                              c.n_layers, c.dropout)
    return make_transformer(shape, seed=c.seed)


@functools.lru_cache(maxsize=64)
def _measure(micro_batch: int, lr: float, seed: int) -> tuple[int, ...]:
    model = trainer_model(TrainConfig(seed=seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)  # the trainer's optimizer
    batch = global_batch(seed, 0, micro_batch, TrainConfig().max_digits)
    parts = memory_breakdown(model, optimizer, batch.inputs, batch.targets,
                             loss_fn=sum_token_loss)  # one real step, then a fresh forward
    return tuple(parts[name] for name in PARTS)


def memory_per_process(micro_batch: int, challenge: Challenge | None = None) -> dict[str, int]:
    """Bytes one process holds for a micro-batch of this size; "total" adds them up."""
    if not isinstance(micro_batch, int) or micro_batch < 1:
        raise ValueError(f"micro_batch must be a whole number >= 1, got {micro_batch!r}")
    c = challenge or Challenge()
    parts = dict(zip(PARTS, _measure(micro_batch, c.lr, c.seed), strict=True))
    parts["total"] = sum(parts.values())
    return parts


def largest_micro_batch(memory_of: Callable[[int], int], budget_bytes: int,
                        examples: int) -> int:
    """The largest micro-batch that divides ``examples`` (one process's share of the global
    batch) and whose memory ``memory_of(b)`` fits the budget; 0 when not even 1 fits."""
    fitting = [b for b in divisors(examples) if memory_of(b) <= budget_bytes]
    return max(fitting, default=0)


def fewest_micro_steps(memory_of: Callable[[int], int], budget_bytes: int, global_size: int,
                       max_nproc: int) -> Split | None:
    """The split with the fewest micro-steps per optimizer step (the work each process does
    one after the other); on a tie, the fewer processes. None when nothing fits."""
    best = None
    for nproc in range(1, max_nproc + 1):
        if global_size % nproc:
            continue  # every process gets the same share
        micro = largest_micro_batch(memory_of, budget_bytes, global_size // nproc)
        if micro == 0:
            continue
        split = Split(nproc, global_size // (nproc * micro), micro)
        if best is None or split.accum_steps < best.accum_steps:
            best = split
    return best


def splits_that_fit(challenge: Challenge, max_nproc: int | None = None) -> list[Split]:
    """Every split with the challenge's global batch that fits its budget, fewest steps first."""
    found = []
    for nproc in range(1, (max_nproc or challenge.max_nproc) + 1):
        if challenge.global_batch % nproc:
            continue
        for micro in divisors(challenge.global_batch // nproc):
            if memory_per_process(micro, challenge)["total"] <= challenge.budget_bytes:
                found.append(Split(nproc, challenge.global_batch // (nproc * micro), micro))
    return sorted(found, key=lambda s: (s.accum_steps, s.nproc))


def problems_before_training(split: Split, challenge: Challenge) -> list[str]:
    """What rules out a split before any training; each item says what to change."""
    problems = []
    if split.nproc > challenge.max_nproc:
        problems.append(f"{split.nproc} processes, but the challenge allows at most "
                        f"{challenge.max_nproc}; use fewer and more accumulation steps")
    g, want = split.global_batch, challenge.global_batch
    if g != want:
        per = split.nproc * split.micro_batch
        fix = (f"with {split.nproc} process(es) x micro-batch {split.micro_batch} that is "
               f"accum_steps = {want // per}" if want % per == 0 else
               f"pick nproc and micro_batch whose product divides {want}")
        problems.append(f"global batch {split} = {g}, but the challenge fixes {want}: keep "
                        f"nproc x accum_steps x micro_batch = {want}; {fix}")
    memory = memory_per_process(split.micro_batch, challenge)
    if memory["total"] > challenge.budget_bytes:
        problems.append(
            f"micro-batch {split.micro_batch} needs {memory['total'] / KIB:.0f} KiB per process "
            f"({memory['activations'] / KIB:.0f} KiB of it activations), over the budget of "
            f"{challenge.budget_kib} KiB: use a smaller micro-batch and more accumulation steps")
    return problems


def train_args(split: Split, challenge: Challenge, metrics_path: str) -> list[str]:
    """The command line of ``python -m course_lib.train`` for this split (without --nproc)."""
    return ["--accum-steps", str(split.accum_steps), "--micro-batch", str(split.micro_batch),
            "--steps", str(challenge.steps), "--lr", str(challenge.lr),
            "--seed", str(challenge.seed), "--metrics", metrics_path,
            "--log-every", str(max(1, challenge.steps // 5))]


def final_loss(losses: list[float], window: int) -> float:
    """Mean of the last ``window`` losses: one step's loss depends on its batch's sums."""
    last = losses[-window:]
    return sum(last) / len(last)


def run_split(split: Split, challenge: Challenge, timeout_s: float = 600,
              quiet: bool = True) -> dict:
    """Train with this split through the entry point; return what the judge looks at."""
    with tempfile.TemporaryDirectory(prefix="capstone-") as folder:
        metrics_path = os.path.join(folder, "metrics.jsonl")
        run = launch("course_lib.train", split.nproc,
                     train_args(split, challenge, metrics_path), timeout_s=timeout_s,
                     quiet=quiet)
        with open(metrics_path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    losses = [r["loss"] for r in records]
    return {"split": [split.nproc, split.accum_steps, split.micro_batch],
            "global_batch": run.result["global_batch"], "steps": len(records),
            "losses": losses, "final_loss": final_loss(losses, challenge.window),
            "replicas_bitwise_equal": run.result["replicas_bitwise_equal"],
            "elapsed_s": run.elapsed_s}


def problems_after_training(run: dict, challenge: Challenge) -> list[str]:
    """What the finished run got wrong; each item says what to look at."""
    problems = []
    if run["global_batch"] != challenge.global_batch:
        problems.append(f"the trainer reported global batch {run['global_batch']}, not "
                        f"{challenge.global_batch}")
    if run["steps"] != challenge.steps:
        problems.append(f"the metrics hold {run['steps']} steps, not {challenge.steps}")
    if not run["replicas_bitwise_equal"]:
        problems.append("the processes' models drifted apart: every rank must apply the same "
                        "averaged gradients")
    if not run["final_loss"] < challenge.target_loss:
        problems.append(f"final loss {run['final_loss']:.3f} is not below the target "
                        f"{challenge.target_loss}: every split with global batch "
                        f"{challenge.global_batch} trains on the same batches, so look at what "
                        "else differs from the challenge (steps, lr, seed)")
    return problems


def shorter(challenge: Challenge, steps: int) -> Challenge:
    """The same challenge cut to ``steps`` steps (for quick comparisons)."""
    return replace(challenge, steps=steps, window=min(challenge.window, steps))
