"""Several data-parallel training runs in one launch, each from the same start (notebook 07).

    python -m course_lib.runtime.launch --nproc 2 course_lib.demos.dp_training --steps 8 \\
        --split 1:16:naive --split 4:4:ring --split 4:4:ring:mean_of_means

Runs on any world size, on Gloo (CPU) or NCCL (one GPU per process). Each ``--split
K:B:SYNC[:LOSS_NORM]`` is one run of ``course_lib.train`` (the same ``train`` function that
``python -m course_lib.train`` calls) with K accumulation steps, micro-batches of B examples per
rank, gradient sync SYNC and loss normalisation LOSS_NORM (default ``tokens``). Starting the
processes once for all runs of a world size saves a few seconds per run; every run rebuilds
its model and optimizer and reseeds every generator, exactly as a fresh launch would.
Rank 0 hands back ``{"world_size": N, "runs": [train's result per split, in order]}``.
"""

from __future__ import annotations

import argparse

from course_lib.core.accumulation import NORMALISATIONS
from course_lib.runtime.launch import save_result
from course_lib.runtime.worker import seed_everything, worker
from course_lib.tasks.batching import micro_batch_slice
from course_lib.train.config import TrainConfig, check_config
from course_lib.train.syncs import SYNCS
from course_lib.train.trainer import train


def parse_split(text: str, steps: int, seed: int) -> TrainConfig:
    """``"K:B:SYNC[:LOSS_NORM]"`` -> the TrainConfig of that run."""
    parts = text.split(":")
    if len(parts) not in (3, 4) or not parts[0].isdigit() or not parts[1].isdigit():
        raise argparse.ArgumentTypeError(
            f"--split {text!r}: write K:B:SYNC or K:B:SYNC:LOSS_NORM, e.g. 4:4:ring")
    sync, loss_norm = parts[2], parts[3] if len(parts) == 4 else "tokens"
    if sync not in SYNCS or loss_norm not in NORMALISATIONS:
        raise argparse.ArgumentTypeError(f"--split {text!r}: SYNC must be one of {SYNCS} and "
                                         f"LOSS_NORM one of {NORMALISATIONS}")
    return TrainConfig(steps=steps, accum_steps=int(parts[0]), micro_batch=int(parts[1]),
                       sync=sync, loss_norm=loss_norm, seed=seed, log_every=max(1, steps // 2))


def describe_share(config: TrainConfig, rank: int, world_size: int) -> str:
    """Which rows of every global batch this rank trains on (each rank prints its own)."""
    global_size = world_size * config.accum_steps * config.micro_batch
    first = micro_batch_slice(global_size, rank, 0, world_size, config.accum_steps)
    last = micro_batch_slice(global_size, rank, config.accum_steps - 1, world_size,
                             config.accum_steps)
    return (f"rank {rank}: rows {first.start}-{last.stop - 1} of each global batch of "
            f"{global_size}, as {config.accum_steps} micro-batch(es) of {config.micro_batch}")


def parse_args() -> tuple[list[TrainConfig], int]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", action="append", required=True, metavar="K:B:SYNC",
                        help="one run: accumulation steps, micro-batch, sync[, loss norm]")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run")
    parser.add_argument("--seed", type=int, default=0, help="weights and batches")
    args = parser.parse_args()
    try:
        configs = [parse_split(s, args.steps, args.seed) for s in args.split]
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    return configs, args.seed


def main() -> None:
    configs, seed = parse_args()
    with worker(seed=seed) as w:
        runs = []
        for config in configs:
            check_config(config, w.world_size, w.local_world_size)
            print(describe_share(config, w.rank, w.world_size), flush=True)
            seed_everything(seed + w.rank)  # as a fresh launch: worker() seeds seed + rank
            result = train(config, w, config.sync)
            result["loss_norm"] = config.loss_norm
            runs.append(result)
        save_result({"world_size": w.world_size, "backend": w.backend, "runs": runs})


if __name__ == "__main__":
    main()
