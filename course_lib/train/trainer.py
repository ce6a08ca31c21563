"""Train the tiny transformer on the sums task, data parallel (notebooks 07, 08 and 09).

    python -m course_lib.train                                  # one process, no torchrun
    python -m course_lib.train --nproc 2 --accum-steps 2        # starts 2 processes itself
    python -m course_lib.train --nproc 2 --sync ring --metrics runs/ring.jsonl
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29500 -m course_lib.train --sync overlap   # on each machine

Any world size, Gloo (CPU) or NCCL (one GPU per process). The global batch is
world_size x accum_steps x micro_batch examples and its content depends only on --seed and the
step, so runs split in different ways compute the same updates. Each step:

    1. every rank builds the step's global batch and takes its own accum_steps micro-batches
    2. the ranks all-reduce their scored-token counts: the loss's denominator
    3. each micro-step backpropagates its token-loss sum x world_size / global_tokens;
       only the last one communicates (``no_sync()`` on the others)
    4. gradients now hold the global batch's gradient on every rank: clip, step, check that
       all replicas are bitwise equal

Rank 0 prints a line every few steps, writes --metrics and checkpoints, and hands back a result
(per-step losses, grad norms, token counts, parameter checksum) to ``course_lib.runtime.launch``.
Options: ``python -m course_lib.train --help``; fault drill: ``course_lib.train.checkpoint``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from dataclasses import asdict

import torch
import torch.distributed as dist

from course_lib.core.train_step import train_step
from course_lib.runtime.launch import LaunchError, launch, report_progress, save_result
from course_lib.runtime.worker import Worker, print0, seed_everything, worker
from course_lib.tasks.batching import micro_batches_of_rank
from course_lib.tasks.models import (
    make_transformer,
    parameter_checksum,
    parameter_vector,
)
from course_lib.tasks.sequences import global_batch
from course_lib.train.checkpoint import (
    CheckpointError,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from course_lib.train.config import ConfigError, TrainConfig, check_config, parse_config
from course_lib.train.syncs import wrap_model


def build(config: TrainConfig, w: Worker):
    """The model (the same weights on every rank: drawn from the seed) and its optimizer."""
    model = make_transformer(config.model_shape, seed=config.seed, dtype=config.torch_dtype,
                             device=w.device)
    if config.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr,
                                      weight_decay=config.weight_decay)
    return model, optimizer


def learning_rate(config: TrainConfig, step: int) -> float:
    """Linear warmup over the first warmup_steps steps (step counts from 1), then constant."""
    if step <= config.warmup_steps:
        return config.lr * step / (config.warmup_steps + 1)
    return config.lr


def one_step(step: int, config: TrainConfig, w: Worker, model, optimizer) -> dict:
    """Optimizer step ``step`` (counting from 1) on this rank; returns what rank 0 reports."""
    batch = global_batch(config.seed, step - 1, config.global_batch_for(w.world_size),
                         config.max_digits)  # the same examples on every rank
    parts = [p.to(w.device) for p in
             micro_batches_of_rank(batch, w.rank, w.world_size, config.accum_steps)]
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(config, step)
    max_norm = config.grad_clip if config.grad_clip > 0 else float("inf")
    record = train_step(model, optimizer, parts, w.group, max_norm, config.loss_norm)
    return {"step": step, **record, "lr": optimizer.param_groups[0]["lr"]}


def replica_checksums(model, w: Worker) -> list[str]:
    """Every rank's parameter hash (all-gathered): all equal when the replicas are bitwise
    equal."""
    mine = torch.tensor(int(parameter_checksum(model)[:15], 16), device=w.device)
    every = [torch.zeros_like(mine) for _ in range(w.world_size)]
    dist.all_gather(every, mine, group=w.group)
    return [f"{int(x):015x}" for x in every]


def log_every(config: TrainConfig) -> int:
    return config.log_every or max(1, config.steps // 10)


def resume_from(config: TrainConfig, w: Worker, model, optimizer) -> int:
    """Load the checkpoint if asked to and one exists; return the last step it completed."""
    state = load_checkpoint(config.checkpoint_dir) if config.resume else None
    if state is None:
        if config.resume:
            print0(w, f"no checkpoint in {config.checkpoint_dir} yet: starting at step 1")
        return 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if not restore_rng(state["rng"], w.rank, w.world_size, w.device):
        print0(w, f"checkpoint made by {len(state['rng'])} processes: random generators "
                  "start fresh (only dropout notices)")
    print0(w, f"resumed after step {state['step']}")
    return state["step"]


def write_metrics(config: TrainConfig, w: Worker, record: dict, first: bool) -> None:
    if config.metrics is None or w.rank != 0:
        return
    folder = os.path.dirname(config.metrics)
    if folder:
        os.makedirs(folder, exist_ok=True)
    mode = "w" if first and not config.resume else "a"  # a resumed run appends
    with open(config.metrics, mode) as f:
        f.write(json.dumps(record) + "\n")


def train(config: TrainConfig, w: Worker, name: str) -> dict:
    """The whole run on this rank with sync strategy ``name``; every rank returns the same."""
    module, optimizer = build(config, w)
    done = resume_from(config, w, module, optimizer)
    model = wrap_model(name, module, w.group, w.device, config.bucket_mb)  # rank 0's weights
    last = min(config.steps, config.stop_after or config.steps)
    print0(w, f"training {config.task} on {w.world_size} process(es), {w.backend}, sync "
              f"{name}: global batch {config.global_batch_for(w.world_size)} = "
              f"{w.world_size} x {config.accum_steps} x {config.micro_batch_for(w.world_size)}")
    records, checksums, equal, start = [], [], True, time.perf_counter()
    for step in range(done + 1, last + 1):
        began = time.perf_counter()
        record = one_step(step, config, w, model, optimizer)
        checksums = replica_checksums(module, w)
        equal = equal and len(set(checksums)) == 1
        if w.device.type == "cuda":
            torch.cuda.synchronize(w.device)
        record["step_time_s"] = time.perf_counter() - began
        records.append(record)
        write_metrics(config, w, record, first=step == 1)
        if step % log_every(config) == 0 or step == last:
            print0(w, f"step {step:4d}/{config.steps}  loss {record['loss']:.4f}  grad_norm "
                      f"{record['grad_norm']:.4f}  tokens {record['tokens']}")
        if config.checkpoint_dir and (step % config.checkpoint_every == 0 or step == last):
            save_checkpoint(config.checkpoint_dir, step, module, optimizer, w.rank,
                            w.world_size, w.device, w.group, extra=asdict(config))
        report_progress(step, last, "steps")
    seconds = time.perf_counter() - start
    print0(w, f"[time] {len(records)} steps in {seconds:.2f} s "
              f"({len(records) / max(seconds, 1e-9):.1f} steps/s)")
    every = [None] * w.world_size  # each rank's own loss per step, before the all-reduce
    dist.all_gather_object(every, [r["rank_loss"] for r in records], group=w.group)
    report = {"replica_checksums": checksums, "rank_losses": every,
              **sync_report(model, config, len(records))}
    return summarise(config, w, name, module, records, equal, done, report)


def sync_report(model, config: TrainConfig, steps: int) -> dict:
    """What our wrappers' all-reduce counter counted (torch DDP does not say)."""
    recorder = getattr(model, "recorder", None)
    if recorder is None:
        return {}
    return {"sync_totals": {"backward_calls": steps * config.accum_steps,
                            "synced_steps": steps, "collectives": recorder.calls,
                            "bytes_reduced": recorder.bytes}}


def summarise(config, w, name, model, records, equal, done, report) -> dict:
    """The result rank 0 hands back: enough to compare runs split in different ways."""
    flat = parameter_vector(model).double().cpu()
    result = {
        "world_size": w.world_size, "backend": w.backend, "sync": name,
        "accum_steps": config.accum_steps, "micro_batch": config.micro_batch_for(w.world_size),
        "global_batch": config.global_batch_for(w.world_size), "dtype": config.dtype,
        "first_step": done + 1, "steps": [r["step"] for r in records],
        "losses": [r["loss"] for r in records], "grad_norms": [r["grad_norm"] for r in records],
        "tokens": [r["tokens"] for r in records], "replicas_bitwise_equal": equal,
        "param_checksum": parameter_checksum(model),
        "param_summary": {"numel": flat.numel(), "sum": float(flat.sum()),
                          "norm": float(flat.norm())},
        **report,
    }
    if config.result_params:
        result["params"] = flat.tolist()
    return result


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run_worker(config: TrainConfig) -> dict:
    """Inside torchrun: check the options for this world size, then join and train."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    check_config(config, world, int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))
    with worker(seed=config.seed) as w:
        if len(config.syncs) == 1:
            result = train(config, w, config.sync)
        else:
            result = {"by_sync": {}}
            for name in config.syncs:  # each from the same start, as if run on its own
                seed_everything(config.seed + w.rank)
                result["by_sync"][name] = train(config, w, name)
        save_result(result)
        # Leave together: a rank that closes its connections while a peer still reads from
        # them can make the peer's communication thread abort (seen with one torchrun agent
        # per node, as in the multi-node rehearsal of notebook 09).
        dist.barrier(group=w.group)
        return result


@contextlib.contextmanager
def single_process_env():
    """A process group of one, without torchrun: the environment it would have set."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    names = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0",
             "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_single_process(config: TrainConfig) -> dict:
    """Train in this process (a world of one) and return the result."""
    with single_process_env():
        return run_worker(config)


def without_nproc(argv: list[str]) -> list[str]:
    """The command line for the workers: the same, minus --nproc and --timeout."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--nproc", "--timeout"):
            skip = True
        elif not arg.startswith(("--nproc=", "--timeout=")):
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    config = parse_config(argv)
    try:
        if under_torchrun():
            if config.nproc is not None:
                raise ConfigError("--nproc starts processes itself; under torchrun leave it "
                                  "out (torchrun's --nproc-per-node sets the world size)")
            run_worker(config)
        elif config.nproc is not None:
            check_config(config, config.nproc)  # before anything starts
            launch("course_lib.train", config.nproc, without_nproc(argv),
                   timeout_s=config.timeout)
        else:
            check_config(config, 1)
            run_single_process(config)
    except (ConfigError, LaunchError) as e:  # CheckpointError is a ConfigError
        if not isinstance(e, CheckpointError) or os.environ.get("RANK", "0") == "0":
            print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)  # every rank reads it
        return 2 if isinstance(e, ConfigError) else 1
    return 0

