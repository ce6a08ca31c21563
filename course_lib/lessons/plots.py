"""The pictures of notebooks 01-04. Each function takes numbers and returns a new Figure.

    from course_lib.lessons import plots
    fig = plots.loss_curves({"big batch": losses_a, "accumulated": losses_b})
    plt.show()

Nothing here computes a result that a notebook asserts: the numbers come from the other
modules, so every picture shows something the notebook has already checked.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import torch

from course_lib.core.buckets import MB

WIDE = (9.0, 3.6)  # two panels side by side


def _as_list(values) -> list[float]:
    return [float(v) for v in values]


def loss_surface(w1: torch.Tensor, w2: torch.Tensor, losses: torch.Tensor,
                 paths: Mapping[str, torch.Tensor], title: str = "loss surface"):
    """Contours of the loss over two weights, with gradient-descent paths (steps + 1, 2)."""
    fig, ax = plt.subplots()
    levels = torch.quantile(losses.flatten().double(), torch.linspace(0, 1, 15,
                            dtype=torch.float64)).tolist()
    contours = ax.contourf(w1.numpy(), w2.numpy(), losses.numpy(), levels=levels,
                           cmap="viridis")
    fig.colorbar(contours, ax=ax, label="mean loss", format="%.2f")
    markers = ["o", "s", "^", "D"]
    for i, (label, path) in enumerate(paths.items()):
        ax.plot(path[:, 0].numpy(), path[:, 1].numpy(), marker=markers[i % 4], ms=3.5, lw=1.2,
                label=label)
    first = next(iter(paths.values()), None)
    if first is not None:
        ax.plot(float(first[0, 0]), float(first[0, 1]), "w*", ms=12, label="start")
    ax.grid(False)
    ax.set_xlim(float(w1[0]), float(w1[-1]))
    ax.set_ylim(float(w2[0]), float(w2[-1]))
    ax.set(xlabel="weight w1", ylabel="weight w2", title=title)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def gradient_noise(batch_sizes: Sequence[int], noise: Sequence[float]):
    """Mean squared distance of a mini-batch gradient from the full gradient, against B."""
    fig, ax = plt.subplots()
    ax.loglog(batch_sizes, noise, "o-", label="measured")
    first = float(noise[0]) * batch_sizes[0]
    ax.loglog(batch_sizes, [first / b for b in batch_sizes], "k--", lw=1, label="c / B")
    ax.set(xlabel="batch size B", ylabel="E ||g_B - g||^2",
           title="gradient noise falls like 1 / B")
    ax.legend()
    fig.tight_layout()
    return fig


def activation_memory(batch_sizes: Sequence[int], measured: Sequence[int], slope: float,
                      intercept: float):
    """Measured activation bytes against batch size, with the fitted straight line."""
    fig, ax = plt.subplots()
    xs = _as_list(batch_sizes)
    ax.plot(xs, [b / MB for b in measured], "o", label="measured (saved tensors)")
    ax.plot(xs, [(slope * b + intercept) / MB for b in xs], "k--", lw=1,
            label=f"{slope / 1024:.2f} KiB per example")
    ax.set(xlabel="batch size B", ylabel="activation memory (MiB)",
           title="activations grow linearly with batch size")
    ax.legend()
    fig.tight_layout()
    return fig


def memory_wall(batch_sizes: Sequence[int], fixed: Mapping[str, int], per_example: float,
                budget_bytes: float, largest: int):
    """Stacked memory (fixed parts plus activations) against batch size, and the budget."""
    fig, ax = plt.subplots()
    xs = _as_list(batch_sizes)
    layers = [[value / MB] * len(xs) for value in fixed.values()]
    layers.append([per_example * b / MB for b in xs])
    ax.stackplot(xs, layers, labels=[*fixed.keys(), "activations"], alpha=0.8)
    ax.axhline(budget_bytes / MB, color="black", lw=1.8, label="memory budget")
    if largest > 0:
        ax.axvline(largest, color="black", ls=":", lw=1.4, label=f"largest batch {largest}")
    ax.set(xlabel="batch size B", ylabel="memory (MiB)", title="the wall")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def loss_curves(curves: Mapping[str, Sequence[float]], title: str = "loss",
                xlabel: str = "optimizer step", ylabel: str = "loss",
                xs: Mapping[str, Sequence[float]] | None = None, logy: bool = False):
    """Several curves on one axis; ``xs`` optionally gives each curve its own x values."""
    fig, ax = plt.subplots()
    styles = ["-", "--", ":", "-."]
    for i, (label, values) in enumerate(curves.items()):
        x = _as_list(xs[label]) if xs else list(range(len(values)))
        ax.plot(x, _as_list(values), styles[i % len(styles)], lw=1.8, label=label)
    if logy:
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def accumulation_cost(accum_steps: Sequence[int], activation_bytes: Sequence[int],
                      step_seconds: Sequence[float], global_batch: int):
    """Two panels: activation memory per micro-step and time per optimizer step, against k."""
    fig, (left, right) = plt.subplots(1, 2, figsize=WIDE)
    left.plot(accum_steps, [b / MB for b in activation_bytes], "o-")
    left.set(xscale="log", xlabel="accumulation steps k", ylabel="activations (MiB)",
             title=f"memory: global batch {global_batch} / k")
    right.plot(accum_steps, [s * 1000 for s in step_seconds], "o-", color="tab:orange")
    right.set(xscale="log", xlabel="accumulation steps k", ylabel="ms per optimizer step",
              title="time: more, smaller micro-steps")
    for ax in (left, right):
        ax.set_xticks(list(accum_steps), [str(k) for k in accum_steps])
    fig.tight_layout()
    return fig


def precision_error(accum_steps: Sequence[int], errors: Mapping[str, Sequence[float]]):
    """Relative error of an accumulated gradient against float64, per accumulation dtype."""
    fig, ax = plt.subplots()
    for label, values in errors.items():
        ax.loglog(accum_steps, values, "o-", label=label)
    ax.set(xlabel="accumulation steps k", ylabel="relative error vs float64",
           title="accumulating gradients in bfloat16 loses digits")
    ax.legend()
    fig.tight_layout()
    return fig


def replica_drift(curves: Mapping[str, Sequence[float]]):
    """Largest parameter gap between replicas after each step, one curve per setting."""
    fig, ax = plt.subplots()
    styles = ["o-", "s--", "^:"]
    for i, (label, values) in enumerate(curves.items()):
        ax.plot(range(1, len(values) + 1), _as_list(values), styles[i % 3], ms=4, label=label)
    ax.set(xlabel="optimizer step", ylabel="max |replica r - replica 0|",
           title="replicas drift apart unless gradients are averaged")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def batch_split(world_size: int, accum_steps: int, micro_batch: int):
    """The global batch as a row of examples: colour = replica, shade = micro-step."""
    total = world_size * accum_steps * micro_batch
    fig, ax = plt.subplots(figsize=(WIDE[0], 1.8))
    colours = plt.get_cmap("tab10")
    for rank in range(world_size):
        for step in range(accum_steps):
            start = (rank * accum_steps + step) * micro_batch
            alpha = 1.0 - 0.6 * step / max(accum_steps, 2)
            ax.barh(0, micro_batch, left=start, color=colours(rank % 10), alpha=alpha,
                    edgecolor="white")
        ax.text((rank + 0.5) * accum_steps * micro_batch, 0, f"replica {rank}",
                ha="center", va="center", fontsize=8, color="black")
    ax.set(xlim=(0, total), yticks=[], xlabel="example index in the global batch",
           title=f"global batch {total} = {world_size} replicas x {accum_steps} micro-steps "
                 f"x {micro_batch} examples")
    fig.tight_layout()
    return fig


def diverging_losses(curves: Mapping[str, Sequence[float]], reference: str,
                     title: str = "loss per optimizer step"):
    """Left: every loss curve. Right: each curve's distance from ``reference`` (log scale)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=WIDE)
    styles = ["-", "--", ":", "-."]
    for i, (label, values) in enumerate(curves.items()):
        left.plot(_as_list(values), styles[i % 4], lw=1.8, label=label)
        if label != reference:
            gap = [max(abs(a - b), 1e-9) for a, b in zip(values, curves[reference], strict=True)]
            right.semilogy(gap, styles[i % 4], lw=1.5, label=label, color=f"C{i}")
    left.set(xlabel="optimizer step", ylabel="loss", title=title)
    right.set(xlabel="optimizer step", ylabel=f"|loss - {reference}|",
              title="distance from the reference (floor 1e-9)")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig
