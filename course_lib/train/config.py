"""The options of ``python -m course_lib.train`` and their checks (notebooks 07 to 09).

``parse_config(argv)`` turns the command line into a :class:`TrainConfig`;
``check_config(config, world_size)`` raises :class:`ConfigError` with one line that says what
to change (with --resume, also when the checkpoint cannot be read). Both run before any
process group exists: in the launching process and again in every worker.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Sequence

import torch

from course_lib.core.accumulation import NORMALISATIONS
from course_lib.runtime.worker import check_backend_fits, choose_backend
from course_lib.tasks.batching import micro_batch_size
from course_lib.tasks.models import TransformerConfig
from course_lib.tasks.sequences import VOCAB, input_length
from course_lib.train.checkpoint import check_checkpoint
from course_lib.train.errors import ConfigError
from course_lib.train.syncs import SYNCS

TASKS = ("sequences",)
DTYPES = {"float32": torch.float32, "float64": torch.float64}
OPTIMIZERS = ("adamw", "sgd")
DEFAULT_MICRO_BATCH = 16


@dataclass(frozen=True)
class TrainConfig:
    """One training run. The global batch is world_size x accum_steps x micro_batch."""

    task: str = "sequences"  # what to learn: sums written as characters
    max_digits: int = 3  # longest operand of the sums task
    d_model: int = 32  # model width
    n_layers: int = 2  # transformer blocks
    n_heads: int = 2  # attention heads
    dropout: float = 0.0  # 0: no randomness in the forward pass
    steps: int = 150  # optimizer steps of the whole run
    accum_steps: int = 1  # micro-steps (forward + backward) per optimizer step
    micro_batch: int | None = None  # examples per micro-step on each rank
    global_batch: int | None = None  # or: examples per optimizer step, split evenly
    lr: float = 3e-3  # peak learning rate
    warmup_steps: int = 10  # learning rate rises linearly over these first steps
    optimizer: str = "adamw"  # "adamw" or "sgd"
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    grad_clip: float = 1.0  # clip the global gradient norm to this; 0 turns clipping off
    seed: int = 0  # model weights and every batch come from it
    sync: str = "ddp"  # how gradients are averaged; "ddp,ring": one run each, same start
    bucket_mb: float = 25.0  # bucket size for ddp, bucketed and overlap
    loss_norm: str = "tokens"  # "tokens" (right) or "mean_of_means" (the bug of notebook 03)
    dtype: str = "float32"  # "float64" for checks to 1e-12
    metrics: str | None = None  # JSON lines file, one object per optimizer step
    checkpoint_dir: str | None = None  # where rank 0 writes checkpoint.pt
    checkpoint_every: int = 10  # steps between checkpoints (and one at the end)
    resume: bool = False  # continue from the checkpoint in checkpoint_dir
    stop_after: int | None = None  # end after this step, as if interrupted
    log_every: int = 0  # print every this many steps; 0 picks about 10 lines
    result_params: bool = False  # put every final parameter in the saved result
    nproc: int | None = None  # start this many processes (outside torchrun)
    timeout: float | None = None  # with nproc: stop the run after this many seconds

    def micro_batch_for(self, world_size: int) -> int:
        if self.global_batch is None:
            return self.micro_batch or DEFAULT_MICRO_BATCH
        return micro_batch_size(self.global_batch, world_size, self.accum_steps)

    def global_batch_for(self, world_size: int) -> int:
        return world_size * self.accum_steps * self.micro_batch_for(world_size)

    @property
    def syncs(self) -> tuple[str, ...]:
        return tuple(self.sync.split(","))

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def model_shape(self) -> TransformerConfig:
        """The transformer these options describe (its inputs fit the longest sum)."""
        return TransformerConfig(len(VOCAB), input_length(self.max_digits), self.d_model,
                                 self.n_heads, self.n_layers, self.dropout)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr (exit code 2)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see python -m course_lib.train --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m course_lib.train",
                      description="Train the tiny transformer, data parallel.")
    d = TrainConfig()
    add = p.add_argument
    add("--task", choices=TASKS, default=d.task)
    add("--max-digits", type=int, default=d.max_digits)
    add("--d-model", type=int, default=d.d_model)
    add("--n-layers", type=int, default=d.n_layers)
    add("--n-heads", type=int, default=d.n_heads)
    add("--dropout", type=float, default=d.dropout)
    add("--steps", type=int, default=d.steps, help="optimizer steps")
    add("--accum-steps", type=int, default=d.accum_steps, help="micro-steps per step")
    add("--micro-batch", type=int, default=None,
        help=f"examples per micro-step per rank (default {DEFAULT_MICRO_BATCH})")
    add("--global-batch", type=int, default=None, help="or: examples per optimizer step")
    add("--lr", type=float, default=d.lr)
    add("--warmup-steps", type=int, default=d.warmup_steps)
    add("--optimizer", choices=OPTIMIZERS, default=d.optimizer)
    add("--weight-decay", type=float, default=d.weight_decay)
    add("--grad-clip", type=float, default=d.grad_clip, help="0 turns clipping off")
    add("--seed", type=int, default=d.seed)
    add("--sync", type=sync_list, default=d.sync, metavar="{" + ",".join(SYNCS) + "}",
        help="gradient sync; a comma list (ddp,ring) trains once with each, same start")
    add("--bucket-mb", type=float, default=d.bucket_mb)
    add("--loss-norm", choices=NORMALISATIONS, default=d.loss_norm)
    add("--dtype", choices=tuple(DTYPES), default=d.dtype)
    add("--metrics", default=None, metavar="PATH", help="JSON lines, one per step")
    add("--checkpoint-dir", default=None, metavar="DIR")
    add("--checkpoint-every", type=int, default=d.checkpoint_every)
    add("--resume", action="store_true", help="continue from the checkpoint in DIR")
    add("--stop-after", type=int, default=None, metavar="STEP",
        help="end after this step as if interrupted (to try --resume)")
    add("--log-every", type=int, default=d.log_every)
    add("--result-params", action="store_true", help="return every final parameter")
    add("--nproc", type=int, default=None, help="start this many processes yourself")
    add("--timeout", type=float, default=None, help="with --nproc: seconds before stopping")
    return p


def sync_list(text: str) -> str:
    """``--sync ring`` or ``--sync ddp,ring,overlap``; each name must be one of SYNCS."""
    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in SYNCS]
    if unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a strategy or a list of different ones; pick from {', '.join(SYNCS)}")
    return ",".join(names)


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """The command line as a TrainConfig; a bad value exits with one line (code 2)."""
    ns = build_parser().parse_args(argv)
    return TrainConfig(**vars(ns))


def _rules(c: TrainConfig) -> list[tuple[bool, str]]:
    """(condition that must hold, what to say when it does not)."""
    return [
        (c.task in TASKS, f"--task must be one of {', '.join(TASKS)}, got {c.task!r}"),
        (c.optimizer in OPTIMIZERS,
         f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {c.optimizer!r}"),
        (c.loss_norm in NORMALISATIONS, f"--loss-norm must be one of "
         f"{', '.join(NORMALISATIONS)}, got {c.loss_norm!r}"),
        (c.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}, got {c.dtype!r}"),
        (all(name in SYNCS for name in c.syncs),
         f"--sync must name one or more of {', '.join(SYNCS)}, got {c.sync!r}"),
        (c.accum_steps >= 1, f"--accum-steps must be >= 1, got {c.accum_steps}; it counts "
         "the micro-steps of one optimizer step"),
        (c.micro_batch is None or c.micro_batch >= 1,
         f"--micro-batch must be >= 1, got {c.micro_batch}"),
        (c.global_batch is None or c.micro_batch is None, "give --micro-batch or "
         "--global-batch, not both (global = world_size x accum_steps x micro)"),
        (c.steps >= 1, f"--steps must be >= 1, got {c.steps}"),
        (c.lr > 0, f"--lr must be > 0, got {c.lr}"),
        (c.warmup_steps >= 0, f"--warmup-steps must be >= 0, got {c.warmup_steps}"),
        (c.weight_decay >= 0, f"--weight-decay must be >= 0, got {c.weight_decay}"),
        (c.grad_clip >= 0, f"--grad-clip must be >= 0 (0 = off), got {c.grad_clip}"),
        (c.seed >= 0, f"--seed must be >= 0, got {c.seed}"),
        (c.bucket_mb > 0, f"--bucket-mb must be > 0, got {c.bucket_mb}; DDP uses 25"),
        (1 <= c.max_digits <= 6, f"--max-digits must be 1..6, got {c.max_digits}"),
        (0 <= c.dropout < 1, f"--dropout must be in [0, 1), got {c.dropout}"),
        (c.n_layers >= 1 and c.n_heads >= 1 and c.d_model >= 1,
         "--d-model, --n-layers and --n-heads must be >= 1"),
        (c.d_model % max(c.n_heads, 1) == 0,
         f"--d-model {c.d_model} is not a multiple of --n-heads {c.n_heads}"),
        (c.checkpoint_every >= 1, f"--checkpoint-every must be >= 1, got {c.checkpoint_every}"),
        (not c.resume or c.checkpoint_dir is not None,
         "--resume needs --checkpoint-dir DIR (where the checkpoint is)"),
        (c.stop_after is None or 1 <= c.stop_after <= c.steps,
         f"--stop-after must be between 1 and --steps {c.steps}, got {c.stop_after}"),
        (c.log_every >= 0, f"--log-every must be >= 0 (0 = about 10 lines), got {c.log_every}"),
        (len(c.syncs) == 1 or (c.metrics is None and c.checkpoint_dir is None),
         "--metrics and --checkpoint-dir need a single --sync strategy"),
        (c.nproc is None or c.nproc >= 1, f"--nproc must be >= 1, got {c.nproc}"),
        (c.timeout is None or c.timeout > 0, f"--timeout must be > 0, got {c.timeout}"),
    ]


def check_config(config: TrainConfig, world_size: int, local_world_size: int | None = None,
                 env: dict | None = None) -> None:
    """Raise ConfigError (one line) unless ``config`` can run on ``world_size`` processes."""
    for holds, message in _rules(config):
        if not holds:
            raise ConfigError(message)
    try:
        config.micro_batch_for(world_size)
    except ValueError as e:
        raise ConfigError(f"{e} (--global-batch, --nproc, --accum-steps)") from None
    local = local_world_size or world_size
    env = os.environ if env is None else env
    try:
        check_backend_fits(choose_backend(local, env), local)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if config.resume and config.checkpoint_dir is not None:
        check_checkpoint(config.checkpoint_dir)  # an unreadable file: one line, before any rank
