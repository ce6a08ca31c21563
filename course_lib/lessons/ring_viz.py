"""The ring all-reduce step by step, as data and as pictures (notebook 06; grids also in 05).

    from course_lib.lessons import ring_viz
    states = ring_viz.ring_states(4)         # states[t][rank][chunk]: ranks summed in so far
    ring_viz.ring_view(world_size=4, step=3)  # draws step 3, returns what it shows
    ring_viz.ring_explorer()                  # a slider through every step

The schedule is the one ``course_lib.core.collectives`` runs, with its chunks (``chunk_bounds``):
in reduce-scatter step s rank r sends chunk (r - s - 1) mod N to rank r + 1, which adds it to
its own copy; in all-gather step s rank r sends chunk (r - s) mod N, which overwrites the copy
of rank r + 1. After N - 1 steps rank r holds the full sum of chunk r; after 2(N - 1) every rank
holds every chunk. ``course_lib.demos.ring_trace`` records a real run and checks it against
``ring_states``. ``phase_steps`` also builds wrong rings (another chunk, the other direction,
a receiver that takes instead of adding), and ``run_steps`` is the one simulation of a ring
that the checkers of exercises 6.1 and 6.3 use to name a learner's mistake.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.core.collectives import ALL_GATHER, REDUCE_SCATTER, chunk_bounds, send_chunk

# pyplot is imported by the functions that draw: the ranks that only read the ring's schedule
# (demos/ring_trace.py, the checkers of 6.1 and 6.3) would each spend 0.6 s of CPU on it


@dataclass(frozen=True)
class RingStep:
    """One step of the ring: every rank sends one chunk to a neighbour at once.

    The right ring sends to the right (``towards`` 1), the receiver puts the chunk where the
    sender took it from (``keeps`` None) and adds it in the reduce-scatter only (``adds``
    None). The other values describe a wrong ring, for the checkers' simulations.
    """

    phase: str  # REDUCE_SCATTER or ALL_GATHER
    index: int  # step within its phase, 0 .. N - 2
    sends: tuple[int, ...]  # sends[r]: the chunk rank r sends to rank (r + towards) mod N
    keeps: tuple[int, ...] | None = None  # keeps[r]: the chunk rank r puts what it receives in
    towards: int = 1  # 1: to the right-hand neighbour, -1: to the left-hand one
    adds: bool | None = None  # the receiver adds (True) or takes (False) the incoming chunk

    def receiver_adds(self) -> bool:
        return self.phase == REDUCE_SCATTER if self.adds is None else self.adds


def _check_world(world_size: int) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a whole number >= 1, got {world_size!r}")


def ring_schedule(world_size: int) -> list[RingStep]:
    """The 2(N - 1) steps: N - 1 of reduce-scatter, then N - 1 of all-gather."""
    _check_world(world_size)
    return [RingStep(phase, s, tuple(send_chunk(r, s, world_size, phase)
                                     for r in range(world_size)))
            for phase in (REDUCE_SCATTER, ALL_GATHER) for s in range(world_size - 1)]


def phase_steps(world_size: int, phase: str, send: int, keep: int | None = None,
                towards: int = 1, adds: bool | None = None) -> list[RingStep]:
    """The N - 1 steps of one phase of any ring, right or wrong: at step s rank r sends chunk
    (r - s - send) mod N and puts what it receives in chunk (r - s - keep) mod N (None: the
    chunk the sender sent). ``ring_schedule`` is send 1, then send 0."""
    n = world_size

    def chunks(offset: int, s: int) -> tuple[int, ...]:
        return tuple((r - s - offset) % n for r in range(n))

    return [RingStep(phase, s, chunks(send, s), None if keep is None else chunks(keep, s),
                     towards, adds) for s in range(n - 1)]


def apply_step(state: list[list], step: RingStep, combine) -> list[list]:
    """The state after ``step``: every send happens at once (a receiver sees the old value).

    ``combine(mine, incoming)`` where the receiver adds (reduce-scatter); otherwise it takes
    the incoming value.
    """
    n = len(state)
    new = [list(row) for row in state]
    for rank, chunk in enumerate(step.sends):
        receiver = (rank + step.towards) % n
        into = chunk if step.keeps is None else step.keeps[receiver]
        incoming = state[rank][chunk]  # what the sender held before this step
        new[receiver][into] = (combine(state[receiver][into], incoming)
                               if step.receiver_adds() else incoming)
    return new


def run_steps(state: list[list], steps: list[RingStep], combine) -> list[list[list]]:
    """``[state, after step 1, after step 2, ...]``: the one simulation of the ring that the
    pictures, the notebook's trace and the checkers of exercises 6.1 and 6.3 all use."""
    states = [state]
    for step in steps:
        states.append(apply_step(states[-1], step, combine))
    return states


def add(mine, incoming):
    """The reduce-scatter's combine: the receiver's copy plus what arrives."""
    return mine + incoming


def ring_states(world_size: int) -> list[list[list[frozenset]]]:
    """``states[t][rank][chunk]``: the ranks whose numbers are summed in, after t steps."""
    start = [[frozenset([r]) for _ in range(world_size)] for r in range(world_size)]
    return run_steps(start, ring_schedule(world_size), lambda mine, incoming: mine | incoming)


def as_masks(state: list[list[frozenset]]) -> list[list[int]]:
    """Each set of ranks as the integer sum of 2^rank: what a real run holds if rank r
    starts with 2^r in every element (``course_lib.demos.ring_trace`` does)."""
    return [[sum(1 << r for r in cell) for cell in row] for row in state]


def split_chunks(flat: torch.Tensor, bounds: list[tuple[int, int]]) -> list[torch.Tensor]:
    """Copies of ``flat[start:end]`` for each (start, end) of ``bounds``."""
    return [flat[a:b].clone() for a, b in bounds]


def simulate_ring_all_reduce(tensors: list[torch.Tensor],
                             bounds: list[tuple[int, int]] | None = None
                             ) -> list[list[torch.Tensor]]:
    """The ring on N tensors in one process: ``result[t][rank]`` is rank's tensor after t steps.

    The chunks are ``bounds`` of each flat tensor (``chunk_bounds(numel, N)`` if None);
    nothing is modified.
    """
    n = len(tensors)
    flat = [t.detach().reshape(-1) for t in tensors]  # N x (numel,)
    bounds = chunk_bounds(flat[0].numel(), n) if bounds is None else bounds
    start = [split_chunks(f, bounds) for f in flat]  # N x N chunks
    states = run_steps(start, ring_schedule(n), add)
    return [[torch.cat(row) for row in state] for state in states]


def bytes_sent_per_rank(numel: int, world_size: int, element_size: int = 4) -> list[int]:
    """Bytes each rank sends in a ring all-reduce, chunk sizes as they really are.

    Rank r sends every chunk but its own in reduce-scatter and every chunk but chunk r + 1 in
    all-gather: 2(N - 1)/N of the tensor when N divides numel, a little more or less if not.
    """
    _check_world(world_size)
    sizes = [b - a for a, b in chunk_bounds(numel, world_size)]
    if world_size == 1:
        return [0]
    return [(numel - sizes[r] + numel - sizes[(r + 1) % world_size]) * element_size
            for r in range(world_size)]


def cell_label(cell: frozenset, world_size: int) -> str:
    """"0+2" for a partial sum, "sum" once every rank is in."""
    if len(cell) == world_size and world_size > 1:
        return "sum"
    return "+".join(str(r) for r in sorted(cell))


def describe_step(world_size: int, t: int) -> list[str]:
    """Lines that say what happens in step t (1-based; 0 is the start) and who holds what."""
    steps = ring_schedule(world_size)
    if not 0 <= t <= len(steps):
        raise ValueError(f"step must be 0..{len(steps)} for world_size {world_size}, got {t}")
    if t == 0:
        lines = ["start: rank r holds only its own numbers in every chunk"]
    else:
        step = steps[t - 1]
        verb = "adds it" if step.phase == REDUCE_SCATTER else "copies it"
        lines = [f"step {t} of {len(steps)} ({step.phase} {step.index + 1}/{world_size - 1}): "
                 f"rank r sends one chunk to rank r+1, which {verb}"]
        lines += [f"  rank {r} -> rank {(r + 1) % world_size}: chunk {c}"
                  for r, c in enumerate(step.sends)]
    state = ring_states(world_size)[t]
    lines += [f"  rank {r} holds: " + " | ".join(f"{cell_label(c, world_size):>7s}" for c in row)
              for r, row in enumerate(state)]
    return lines


def draw_grid(ax, labels: list[list[str]], shades: list[list[float]], title: str,
              col_name: str = "chunk") -> None:
    """A ranks x columns table: each cell's text and its shade (0 white .. 1 dark)."""
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("Blues")
    rows, cols = len(labels), len(labels[0]) if labels else 0
    for r in range(rows):
        for c in range(cols):
            shade = shades[r][c]
            ax.add_patch(plt.Rectangle((c, r), 1, 1, facecolor=cmap(0.1 + 0.75 * shade),
                                       edgecolor="white", linewidth=2))
            ax.text(c + 0.5, r + 0.5, labels[r][c], ha="center", va="center", fontsize=8,
                    color="white" if shade > 0.6 else "black")
    ax.set(xlim=(0, max(cols, 1)), ylim=(rows, 0), title=title)
    ax.set_xticks([c + 0.5 for c in range(cols)], [f"{col_name} {c}" for c in range(cols)],
                  fontsize=8)
    ax.set_yticks([r + 0.5 for r in range(rows)], [f"rank {r}" for r in range(rows)],
                  fontsize=8)
    ax.tick_params(length=0)
    ax.grid(False)


def draw_ring_step(world_size: int, t: int, ax=None):
    """The grid after step t; the copies that received a chunk in that step are outlined."""
    import matplotlib.pyplot as plt

    state = ring_states(world_size)[t]
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(
        figsize=(1.3 * world_size + 1.5, 0.7 * world_size + 1.2))
    labels = [[cell_label(c, world_size) for c in row] for row in state]
    shades = [[len(c) / world_size for c in row] for row in state]
    title = "start" if t == 0 else describe_step(world_size, t)[0].split(":")[0]
    draw_grid(ax, labels, shades, title)
    if t > 0:  # outline the copies that just changed: each received one chunk from the left
        step = ring_schedule(world_size)[t - 1]
        for r, c in enumerate(step.sends):
            ax.add_patch(plt.Rectangle((c + 0.04, (r + 1) % world_size + 0.04), 0.92, 0.92,
                                       fill=False, edgecolor="tab:orange", linewidth=2.5))
    fig.tight_layout()
    return fig


def draw_ring_steps(world_size: int = 4):
    """Every step of the ring side by side: the whole algorithm in one picture."""
    import matplotlib.pyplot as plt

    total = 2 * (world_size - 1) + 1
    cols = min(total, 4)
    rows = -(-total // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, (0.5 * world_size + 0.9) * rows),
                             squeeze=False)
    for t, ax in enumerate(axes.flat):
        if t < total:
            draw_ring_step(world_size, t, ax=ax)
        else:
            ax.axis("off")
    fig.tight_layout()
    return fig


def ring_view(world_size: int = 4, step: int = 3) -> dict:
    """Draw one step of the ring and return what the grid shows (no randomness)."""
    draw_ring_step(world_size, step)
    state = ring_states(world_size)[step]
    complete = sorted((r, c) for r, row in enumerate(state) for c, cell in enumerate(row)
                      if len(cell) == world_size)
    return {"world_size": world_size, "step": step,
            "phase": "start" if step == 0 else ring_schedule(world_size)[step - 1].phase,
            "complete (rank, chunk)": complete}


def ring_explorer(world_size: int = 4):
    """A slider through the 2(N - 1) steps of the ring, for N processes."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    def show(world_size: int, step: int) -> None:
        step = min(step, 2 * (world_size - 1))
        print("\n".join(describe_step(world_size, step)))
        draw_ring_step(world_size, step)
        plt.show()

    return w.interactive(
        show, world_size=w.IntSlider(value=world_size, min=2, max=6, description="processes",
                                     continuous_update=False),
        step=w.IntSlider(value=0, min=0, max=10, description="step"))


def draw_before_after(name: str, before: list[list[float]], after: list) -> object:
    """05's picture of one collective: what each rank holds before and after."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(7.0, 0.45 * len(before) + 1.0),
                                      width_ratios=[max(len(r) for r in before),
                                                    max(len(a or []) for a in after) or 1])
    scale = max(abs(v) for row in before for v in row) * len(before) or 1.0
    for ax, rows, when in ((left, before, "before"), (right, after, "after")):
        width = max(len(r or []) for r in rows) or 1
        labels = [[f"{v:g}" for v in r] if r is not None else ["?"] + [""] * (width - 1)
                  for r in rows]
        shades = [[v / scale for v in r] if r is not None else [0.0] * width for r in rows]
        draw_grid(ax, labels, shades, f"{name}: {when}", col_name="element")
    fig.tight_layout()
    return fig
