"""All-reduce on 8 to 4,096 simulated ranks: what the alpha-beta model is for (notebook 06).

This laptop runs 2 to 4 processes; a cluster runs thousands. The simulator plays each
all-reduce's schedule over N ranks and adds up the time. Plain Python: no processes, no tensors.

    from course_lib.lessons import network_sim
    run = network_sim.simulate("ring", 1024, 64 * 2**20, "InfiniBand NDR 400 Gb/s")
    run.time_s, run.bytes_sent[0], run.messages_sent[0], run.steps
    network_sim.crossovers("InfiniBand NDR 400 Gb/s", 1024)  # which algorithm wins where

Its plots are in ``course_lib.lessons.network_plots``.

The algorithms (the first three as ``course_lib.core.collectives`` runs them):
- naive: every rank sends its tensor to rank 0, which adds them in rank order and sends the
  sum back to each rank, one message at a time through rank 0's link;
- ring: reduce-scatter then all-gather, N-1 steps each, in chunks as chunk_bounds cuts them;
- recursive_doubling: log2(N) rounds of whole-tensor swaps; when N is not a power of two the
  extra ranks fold into the first ones before and get the sum back after;
- tree: one binary tree (rank r's children are 2r+1 and 2r+2): reduce to rank 0, then
  broadcast from it; the whole tensor, or ``tree_pieces`` pieces one behind the other.
  NCCL's double binary tree is another design: two trees, each carrying half the data in
  small pipelined chunks, so that no rank's link idles.

The network model (``course_lib.lessons.links``):
- each rank has one full-duplex link: it can send one message and receive one at a time;
- a message of n bytes from a to b occupies a's sending side and b's receiving side for
  latency + n / bandwidth seconds; a message that needs a side in use waits for it;
- a rank adds a message into its sum before it takes the next one (as collectives.py does);
  an add costs n / reduce_bytes_per_s seconds, nothing by default;
- every pair of ranks is one hop apart and nothing else shares the network: no topology,
  no congestion in switches, no noise. The ring is not cut into slices as collectives.py's is.

The ring is simulated step by step (every step uses each side of every link once, so a step
lasts as long as its largest message); the others message by message, each message starting
when its data is ready and both sides are free, in the order the schedule lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Sequence

from course_lib.lessons.cost_model import AlphaBeta
from course_lib.lessons.links import Link, Network, get_link, link_from_model

ALGORITHMS = ("naive", "ring", "recursive_doubling", "tree")
FLOAT32 = 4  # bytes per element: the course's tensors are float32


@dataclass(frozen=True)
class Simulation:
    """One all-reduce of ``nbytes`` bytes over ``world_size`` ranks on one kind of link."""

    algorithm: str
    world_size: int
    nbytes: int
    link: str
    time_s: float  # until the last rank holds the sum
    bytes_sent: tuple[int, ...]  # per rank
    messages_sent: tuple[int, ...]  # per rank
    steps: int  # rounds of the schedule (see simulate)

    @property
    def max_bytes_sent(self) -> int:
        return max(self.bytes_sent)


def chunk_sizes(numel: int, parts: int) -> list[int]:
    """Elements per chunk, cut as ``collectives.chunk_bounds`` cuts: the first numel % parts
    chunks get one element more."""
    base, extra = divmod(numel, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def _naive(n: int, numel: int, element_size: int, net: Network) -> tuple[float, int]:
    size = numel * element_size
    total = 0.0
    for src in range(1, n):  # rank 0 takes one tensor at a time, in rank order, and adds it
        total = net.send(src, 0, size, 0.0, add=True)
    finished = total
    for dst in range(1, n):  # then sends the sum out, one copy after another
        finished = net.send(0, dst, size, total)
    return finished, 2 * (n - 1)


def _recursive_doubling(n: int, numel: int, element_size: int,
                        net: Network) -> tuple[float, int]:
    size = numel * element_size
    power = 1 << (n.bit_length() - 1)  # the largest power of two <= N
    ready = [0.0] * n  # when each rank's partial sum is ready
    rounds = 0
    if power < n:  # fold: rank r >= power hands its tensor to rank r - power
        for r in range(power, n):
            ready[r - power] = net.send(r, r - power, size, ready[r], add=True)
        rounds += 1
    distance = 1
    while distance < power:  # r and r XOR distance swap: each side of each link used once
        before = list(ready)  # both partners send what they held before the swap
        for r in range(power):
            ready[r] = net.send(r ^ distance, r, size, before[r ^ distance], add=True)
        distance, rounds = distance * 2, rounds + 1
    if power < n:  # unfold: the extra ranks get the sum back
        for r in range(power, n):
            ready[r] = net.send(r - power, r, size, ready[r - power])
        rounds += 1
    return max(ready), rounds


def _around_the_ring(diff: list[int], first: int, count: int, amount: int) -> None:
    """Add ``amount`` to ranks first .. first + count - 1 (mod N), kept as differences."""
    n = len(diff) - 1
    diff[first] += amount
    if first + count <= n:
        diff[first + count] -= amount
    else:  # the stretch wraps round past rank N - 1 to rank 0
        diff[n] -= amount
        diff[0] += amount
        diff[first + count - n] -= amount


def _ring(n: int, numel: int, element_size: int, net: Network) -> tuple[float, int]:
    """Step by step; each rank's bytes follow the send rule without looping over all sends."""
    base, bigger = divmod(numel, n)  # chunk_bounds: the first `bigger` chunks have base + 1
    small, big = base * element_size, (base + 1) * element_size
    largest = big if bigger else small  # every step sends all N chunks, one per rank
    diff, total = [0] * (n + 1), 0.0
    for shift, adds in ((1, True), (0, False)):  # reduce-scatter, then all-gather
        for step in range(n - 1):
            # rank r sends chunk (r - step - shift) mod N (ring_viz.send_chunk), so the ranks
            # that send one of the bigger chunks 0 .. bigger-1 start at rank step + shift
            _around_the_ring(diff, (step + shift) % n, bigger, big - small)
            total += net.link.message_s(largest) + (net.add_s(largest) if adds else 0.0)
    net.bytes_sent = [2 * (n - 1) * small + more for more in accumulate(diff[:n])]
    net.messages_sent = [2 * (n - 1)] * n
    return total, 2 * (n - 1)


def _tree(n: int, numel: int, element_size: int, net: Network,
          pieces: int) -> tuple[float, int]:
    """Binary tree, rank r's children 2r+1 and 2r+2: reduce to rank 0, then broadcast.

    With ``pieces`` > 1 the tensor is cut into pieces (as chunk_bounds cuts) that follow each
    other up the tree, and then down, so that different levels work on different pieces.
    """
    sizes = [c * element_size for c in chunk_sizes(numel, min(pieces, max(numel, 1)))]
    children = [[c for c in (2 * r + 1, 2 * r + 2) if c < n] for r in range(n)]
    ready = [[0.0] * n for _ in sizes]  # ready[p][r]: r holds its subtree's sum of piece p
    for p, size in enumerate(sizes):
        for r in reversed(range(n)):  # children have higher ranks: they go first
            for child in children[r]:  # one at a time through r's receiving side
                ready[p][r] = net.send(child, r, size, ready[p][child], add=True)
    finished = 0.0
    for p, size in enumerate(sizes):
        have = [ready[p][0]] + [0.0] * (n - 1)  # when each rank holds the sum of piece p
        for r in range(n):  # parents before children
            for child in children[r]:  # one copy after another through r's sending side
                have[child] = net.send(r, child, size, have[r])
        finished = max(finished, *have)
    depth = n.bit_length() - 1  # levels below rank 0
    return finished, 2 * (depth + len(sizes) - 1) if n > 1 else 0


def _whole_number(value, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")


def _check(algorithm: str, world_size: int, nbytes: int, element_size: int) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; pass one of {ALGORITHMS}")
    _whole_number(world_size, "world_size (the number of ranks)", 1)
    _whole_number(element_size, "element_size (bytes per element)", 1)
    _whole_number(nbytes, "nbytes (the tensor's size in bytes)", 0)
    if nbytes % element_size:
        raise ValueError(f"nbytes={nbytes} is not a whole number of {element_size}-byte "
                         "elements; pass a multiple of element_size")


def simulate(algorithm: str, world_size: int, nbytes: int, link: Link | str, *,
             element_size: int = FLOAT32, reduce_bytes_per_s: float | None = None,
             tree_pieces: int = 1) -> Simulation:
    """One all-reduce of a tensor of ``nbytes`` bytes on ``world_size`` ranks.

    ``steps``: naive 2(N-1) (rank 0's messages, one by one); ring 2(N-1); recursive doubling
    log2 of the largest power of two <= N, plus a fold and an unfold otherwise; tree 2 x its
    depth, plus 2 x (pieces - 1) when pipelined. A 1-rank all-reduce sends nothing.
    """
    _check(algorithm, world_size, nbytes, element_size)
    _whole_number(tree_pieces, "tree_pieces", 1)
    if reduce_bytes_per_s is not None and not reduce_bytes_per_s > 0:
        raise ValueError("reduce_bytes_per_s must be > 0, or None for free additions")
    link = get_link(link)
    net = Network(world_size, link, reduce_bytes_per_s)
    run = {"naive": _naive, "ring": _ring, "recursive_doubling": _recursive_doubling,
           "tree": lambda *args: _tree(*args, pieces=tree_pieces)}[algorithm]
    time_s, steps = run(world_size, nbytes // element_size, element_size, net)
    return Simulation(algorithm, world_size, nbytes, link.name, time_s, tuple(net.bytes_sent),
                      tuple(net.messages_sent), steps)


@dataclass(frozen=True)
class SizeRange:
    """Tensor sizes (bytes, both ends included) for which ``algorithm`` is the fastest."""

    algorithm: str
    low_bytes: int
    high_bytes: int


def fastest(link: Link | str, world_size: int, nbytes: int,
            algorithms: Sequence[str] = ALGORITHMS, **options) -> str:
    """The algorithm with the shortest simulated time (the first listed, on a tie)."""
    times = {name: simulate(name, world_size, nbytes, link, **options).time_s
             for name in algorithms}
    return min(algorithms, key=times.__getitem__)


def size_grid(low_bytes: int, high_bytes: int, points: int, element_size: int) -> list[int]:
    """About ``points`` sizes evenly spaced on a log scale, whole elements, no repeats."""
    low, high = max(1, -(-low_bytes // element_size)), high_bytes // element_size
    if not 1 <= low <= high or points < 2:
        raise ValueError("pass 0 < low_bytes <= high_bytes (at least one element) and "
                         "points >= 2")
    ratio = (high / low) ** (1 / (points - 1))
    return sorted({round(low * ratio ** i) * element_size for i in range(points)})


def crossovers(link: Link | str, world_size: int, *, low_bytes: int = 1 << 10,
               high_bytes: int = 1 << 30, points: int = 31,
               algorithms: Sequence[str] = ALGORITHMS, element_size: int = FLOAT32,
               **options) -> list[SizeRange]:
    """Which algorithm wins for which sizes, small to large: each range after the first
    starts at a crossover, found by bisection to one element. The winner is checked at
    ``points`` sizes first, so a range narrower than one step of that grid can be missed."""
    def winner(numel: int) -> str:
        return fastest(link, world_size, numel * element_size, algorithms,
                       element_size=element_size, **options)

    grid = [b // element_size for b in size_grid(low_bytes, high_bytes, points, element_size)]
    ranges, start, current = [], grid[0], winner(grid[0])
    for low, high in zip(grid, grid[1:], strict=False):
        while winner(high) != current:  # a change somewhere in (low, high]: bisect to it
            below, above = low, high  # winner(below) == current != winner(above)
            while above - below > 1:
                middle = (below + above) // 2
                below, above = (middle, above) if winner(middle) == current else (below, middle)
            ranges.append(SizeRange(current, start * element_size, below * element_size))
            low, start, current = above, above, winner(above)
    ranges.append(SizeRange(current, start * element_size, grid[-1] * element_size))
    return ranges


def predict_rows(model: AlphaBeta, sizes: Sequence[int], world_sizes: Sequence[int] = (2, 4),
                 algorithms: Sequence[str] = ("naive", "ring", "recursive_doubling"),
                 element_size: int = FLOAT32) -> dict[int, list[dict]]:
    """This machine's fitted alpha and beta, simulated: rows like the measured ones.

    ``result[world_size]`` holds ``{"algorithm", "bytes", "median_s"}`` rows as
    ``bench_all_reduce_worker`` saves them (the same bytes for the same ``sizes``), with the
    simulated time in ``median_s``: a table or ``network_plots.plot_measured`` takes either.
    These three algorithms send the messages ``cost_model.predict_all_reduce_s`` counts, so
    its numbers come out again (the ring's exactly when N divides the tensor).

    Why measurements on a shared 2-core CPU sit above these predictions: the model gives each
    rank a link of its own, but here N processes share 2 cores and one memory bus, so their
    "links" (memory copies between processes) slow each other down, the more so the larger
    N; every message also pays Python's and Gloo's per-call overhead, which the fitted alpha
    measured for one ping-pong, not for N processes at once; and the additions, free in the
    model, take CPU time that the sends need too.
    """
    link = link_from_model(model)
    rows: dict[int, list[dict]] = {}
    for n in world_sizes:
        rows[n] = []
        for size in sizes:
            nbytes = max(1, size // element_size) * element_size  # as the benchmark rounds
            rows[n] += [{"algorithm": name, "bytes": nbytes,
                         "median_s": simulate(name, n, nbytes, link,
                                              element_size=element_size).time_s}
                        for name in algorithms]
    return rows
