"""Interactive explorers for notebooks 01-04.

Each explorer is a slider around a *view*: a pure function that draws one figure and returns a
small dict of rounded numbers. A notebook calls the view with its defaults in a normal cell
(checked by nbval) and shows the explorer in a cell tagged ``nbval-ignore-output``:

    summary = widgets.learning_rate_view()      # checked: same numbers every run
    widgets.learning_rate_explorer()            # interactive: move the slider
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from course_lib.lessons import gradients, memory, plots, replicas
from course_lib.tasks import batching, toy

MiB = 2**20


def learning_rate_view(lr: float = 0.3, steps: int = 15) -> dict:
    """Gradient descent on a two-weight logistic regression, drawn on its loss surface."""
    x, y = toy.two_blobs(200, seed=0, dtype=torch.float64)
    loss_of_w = lambda w: gradients.logistic_loss(w, x, y)
    w0 = torch.tensor([-2.0, 2.0], dtype=torch.float64)  # a fixed, poor start
    path, losses = gradients.gradient_descent(loss_of_w, w0, lr, steps)
    w1 = torch.linspace(-2.5, 3.5, 61, dtype=torch.float64)
    w2 = torch.linspace(-2.5, 2.5, 51, dtype=torch.float64)
    path = path.clamp(min=-10.0, max=10.0)  # a diverging path still fits the picture
    plots.loss_surface(w1, w2, gradients.loss_grid(loss_of_w, w1, w2), {f"lr = {lr:g}": path},
                       title=f"{steps} steps of gradient descent")
    return {"lr": lr, "first loss": round(losses[0], 4), "last loss": round(losses[-1], 4),
            "loss went down": losses[-1] < losses[0]}


def learning_rate_explorer():
    """A slider for the learning rate of :func:`learning_rate_view`."""
    import ipywidgets as w

    def show(lr: float, steps: int) -> None:
        print(learning_rate_view(lr, steps))
        plt.show()

    return w.interactive(
        show, lr=w.FloatLogSlider(value=0.3, base=10, min=-2, max=1, step=0.05,
                                  continuous_update=False, description="learning rate"),
        steps=w.IntSlider(value=15, min=1, max=60, continuous_update=False,
                          description="steps"))


def _budget_model():
    return toy.make_mlp(hidden=256, depth=3, norm="layer", seed=0)


def memory_budget_view(budget_mib: float = 4.0, global_batch: int = 1024) -> dict:
    """The wall for a 3-layer MLP trained with Adam: which batch fits in ``budget_mib``?"""
    model = _budget_model()
    params = memory.parameter_bytes(model)
    fixed = {"parameters": params, "gradients": params, "Adam state": 2 * params}
    x, y = toy.two_moons(64, seed=0)
    per_example = memory.activation_bytes(model, x, y) / 64  # bytes for one more example
    budget = budget_mib * MiB
    largest = memory.largest_batch_that_fits(budget, sum(fixed.values()), per_example)
    sizes = list(range(0, global_batch + 1, max(1, global_batch // 64)))
    plots.memory_wall(sizes, fixed, per_example, budget, largest)
    fits = largest >= 1
    return {"budget MiB": budget_mib, "fixed MiB": round(sum(fixed.values()) / MiB, 2),
            "largest micro-batch": largest,
            "accumulation steps": (memory.accumulation_steps_needed(global_batch,
                                                                    largest) if fits else None)}


def memory_budget_explorer():
    """A slider for the memory budget of :func:`memory_budget_view`."""
    import ipywidgets as w

    def show(budget_mib: float) -> None:
        print(memory_budget_view(budget_mib))
        plt.show()

    return w.interactive(show, budget_mib=w.FloatSlider(
        value=4.0, min=1.0, max=10.0, step=0.25, continuous_update=False,
        description="budget MiB"))


def accumulation_view(accum_steps: int = 4, global_batch: int = 256) -> dict:
    """Accumulate over ``accum_steps`` micro-batches: memory per micro-step, and equality."""
    model = _budget_model()
    x, y = toy.two_moons(global_batch, seed=1)
    choices = [k for k in batching.divisors(global_batch) if k <= 64]
    if accum_steps not in choices:
        raise ValueError(f"accum_steps={accum_steps} must divide {global_batch}: one of {choices}")
    big = gradients.batch_grad(model, x, y)
    acc = sum(gradients.batch_grad(model, xm, ym) / accum_steps  # each micro mean, scaled by 1/k
              for xm, ym in zip(x.chunk(accum_steps), y.chunk(accum_steps), strict=True))
    used = [memory.activation_bytes(model, x[:global_batch // k], y[:global_batch // k])
            for k in choices]
    fig, ax = plt.subplots()
    ax.bar([str(k) for k in choices], [b / MiB for b in used],
           color=["tab:red" if k == accum_steps else "tab:blue" for k in choices])
    ax.set(xlabel="accumulation steps k", ylabel="activations per micro-step (MiB)",
           title=f"global batch {global_batch}: the same gradient, 1/k of the activations")
    fig.tight_layout()
    return {"accumulation steps": accum_steps, "micro-batch": global_batch // accum_steps,
            "activation MiB": round(used[choices.index(accum_steps)] / MiB, 3),
            "equals big batch": gradients.relative_error(acc, big) <= 1e-6}


def accumulation_explorer():
    """A slider for the accumulation steps of :func:`accumulation_view`."""
    import ipywidgets as w

    def show(accum_steps: int) -> None:
        print(accumulation_view(accum_steps))
        plt.show()

    return w.interactive(show, accum_steps=w.SelectionSlider(
        options=[1, 2, 4, 8, 16, 32, 64], value=4, continuous_update=False,
        description="accum steps"))


def workers_view(world_size: int = 4, accum_steps: int = 1, global_batch: int = 32,
                 steps: int = 5) -> dict:
    """Split a global batch over ``world_size`` replicas and train them, synced or not."""
    micro = batching.micro_batch_size(global_batch, world_size, accum_steps)
    plots.batch_split(world_size, accum_steps, micro)
    x, y = toy.two_moons(256, seed=0)
    batches = toy.batches(x, y, global_batch, steps, seed=0)
    model = toy.make_mlp(hidden=16, norm="layer", seed=0)
    synced = replicas.train_replicas(model, batches, world_size, 0.5, accum_steps, sync=True)
    unsynced = replicas.train_replicas(model, batches, world_size, 0.5, accum_steps, sync=False)
    single, _ = replicas.train_single(model, batches, 0.5)
    ours = torch.cat([p.reshape(-1) for p in synced["replicas"][0].parameters()])
    theirs = torch.cat([p.reshape(-1) for p in single.parameters()])
    return {"world size": world_size, "micro-batch": micro,
            "identical with sync": all(synced["identical"]),
            "gap without sync": round(unsynced["difference"][-1], 4),
            "equals big batch": gradients.relative_error(ours, theirs) <= 1e-5}


def workers_explorer():
    """Sliders for the number of replicas and accumulation steps of :func:`workers_view`."""
    import ipywidgets as w

    def show(world_size: int, accum_steps: int) -> None:
        print(workers_view(world_size, accum_steps))
        plt.show()

    return w.interactive(
        show,
        world_size=w.SelectionSlider(options=[1, 2, 4, 8, 16], value=4,
                                     continuous_update=False, description="workers"),
        accum_steps=w.SelectionSlider(options=[1, 2], value=1, continuous_update=False,
                                      description="accum steps"))
