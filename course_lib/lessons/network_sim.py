"""All-reduce on 8 to 4,096 simulated ranks: what the alpha-beta model is for (notebook 06b).

This laptop runs 2 to 4 processes; a cluster runs thousands. The simulator plays each
all-reduce's schedule over N ranks and adds up the time. Plain Python: no processes, no tensors.

    from course_lib.lessons import network_sim
    run = network_sim.simulate("ring", 1024, 64 * 2**20, "InfiniBand NDR 400 Gb/s")
    run.time_s, run.bytes_sent[0], run.messages_sent[0], run.steps
    network_sim.crossovers("InfiniBand NDR 400 Gb/s", 1024)  # which algorithm wins where
    nodes = Cluster(8, "NVLink 4 (H100)", "InfiniBand NDR 400 Gb/s")  # links.Cluster
    network_sim.simulate("two_level", 512, 64 * 2**20, nodes).bytes_between_nodes
    network_sim.simulate("ring_channels", 512, 64 * 2**20, nodes).time_s  # a ring per adapter

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
  small pipelined chunks, so that no rank's link idles;
- halving_doubling (Rabenseifner's algorithm, N a power of two): a reduce-scatter in log2(N)
  rounds, rank r swapping with r XOR 2^k and keeping half of the chunks it still holds, then
  an all-gather in the same rounds backwards: the ring's bytes, 2(N-1)/N of the tensor per
  rank, in 2 log2(N) messages instead of 2(N-1);
- two_level (on a ``Cluster``): a ring reduce-scatter inside each node, then, for each chunk,
  a ring all-reduce across the nodes of the ranks that hold it, then a ring all-gather inside
  each node. Only 2(G-1)/N of the tensor leaves each rank's node (G nodes), where a flat
  ring's boundary ranks send all of their 2(N-1)/N between nodes;
- ring_channels (on a ``Cluster`` of L ranks a node): the flat ring in L channels, as NCCL
  runs it with one adapter per GPU. The tensor is cut into L parts, each all-reduced by its own
  ring of all N ranks; ring c leaves each node from place c, so every adapter carries one
  ring's 2(N-1)/N of its part, and the rings' steps inside the nodes run at the same time.

The network model (``course_lib.lessons.links``):
- each rank has one full-duplex link (one of each kind on a ``Cluster``): it can send one
  message and receive one at a time;
- a message of n bytes from a to b occupies a's sending side and b's receiving side for
  latency + n / bandwidth seconds; a message that needs a side in use waits for it;
- a rank adds a message into its sum before it takes the next one (as collectives.py does);
  an add costs n / reduce_bytes_per_s seconds, nothing by default;
- every pair of ranks is one hop apart and nothing else shares the network: no topology
  beyond a ``Cluster``'s two links, no congestion in switches, no noise. The ring is not cut
  into slices as fast_ring.py's is.

The rings (ring, two_level, ring_channels) are simulated step by step (every step uses each
side of every link once, so a step lasts as long as its slowest message; ring_channels' rings
hand their chunks for one neighbour over together, as one message); the others message by
message, each message starting when its data is ready and both sides are free, in the order
the schedule lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from course_lib.lessons import network_schedules as schedules
from course_lib.lessons.cost_model import AlphaBeta
from course_lib.lessons.links import Cluster, Link, Network, get_links, link_from_model
from course_lib.lessons.network_schedules import chunk_sizes

__all__ = ["ALGORITHMS", "ANY_WORLD_SIZE", "FLOAT32", "ON_NODES", "SizeRange", "Simulation",
           "chunk_sizes", "crossovers", "fastest", "predict_rows", "simulate", "size_grid",
           "time_of"]

ANY_WORLD_SIZE = ("naive", "ring", "recursive_doubling", "tree")  # fastest's default race
ALGORITHMS = ANY_WORLD_SIZE + ("halving_doubling", "two_level", "ring_channels")
ON_NODES = ("two_level", "ring_channels")  # these need a Cluster
FLOAT32 = 4  # bytes per element: the course's tensors are float32


@dataclass(frozen=True)
class Simulation:
    """One all-reduce of ``nbytes`` bytes over ``world_size`` ranks on one network."""

    algorithm: str
    world_size: int
    nbytes: int
    link: str
    time_s: float  # until the last rank holds the sum
    bytes_sent: tuple[int, ...]  # per rank
    messages_sent: tuple[int, ...]  # per rank
    steps: int  # rounds of the schedule (see simulate)
    bytes_between_nodes: tuple[int, ...] = ()  # per rank, the part that left its node

    @property
    def max_bytes_sent(self) -> int:
        return max(self.bytes_sent)


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


def _check_network(algorithm: str, world_size: int, links: Link | Cluster) -> None:
    if algorithm == "halving_doubling" and world_size & (world_size - 1):
        raise ValueError(f"halving_doubling pairs rank r with r XOR 2^k, so world_size must be a "
                         f"power of two, got {world_size}; recursive_doubling folds extra ranks")
    if algorithm in ON_NODES and not isinstance(links, Cluster):
        raise ValueError(f"{algorithm} needs nodes: pass a links.Cluster(ranks_per_node, "
                         "inside, between) as the link")
    if isinstance(links, Cluster) and world_size % links.ranks_per_node:
        raise ValueError(f"world_size={world_size} does not fill nodes of "
                         f"{links.ranks_per_node} ranks; pass a multiple of ranks_per_node")


def simulate(algorithm: str, world_size: int, nbytes: int, link: Link | str | Cluster, *,
             element_size: int = FLOAT32, reduce_bytes_per_s: float | None = None,
             tree_pieces: int = 1) -> Simulation:
    """One all-reduce of a tensor of ``nbytes`` bytes on ``world_size`` ranks.

    ``link``: one kind of link for every pair of ranks (a ``Link`` or its name in ``LINKS``),
    or a ``Cluster`` of nodes. ``steps``: naive 2(N-1) (rank 0's messages, one by one); ring
    2(N-1); recursive doubling log2 of the largest power of two <= N, plus a fold and an unfold
    otherwise; halving-doubling 2 log2(N); two-level 2(L-1) + 2(G-1) for G nodes of L ranks;
    ring_channels 2(N-1), its L rings stepping together;
    tree 2 x its depth, plus 2 x (pieces - 1) when pipelined. A 1-rank all-reduce sends nothing.
    """
    _check(algorithm, world_size, nbytes, element_size)
    _whole_number(tree_pieces, "tree_pieces", 1)
    if reduce_bytes_per_s is not None and not reduce_bytes_per_s > 0:
        raise ValueError("reduce_bytes_per_s must be > 0, or None for free additions")
    links = get_links(link)
    _check_network(algorithm, world_size, links)
    net = Network(world_size, links, reduce_bytes_per_s)
    run = {"naive": schedules.naive, "ring": schedules.ring,
           "recursive_doubling": schedules.recursive_doubling,
           "halving_doubling": schedules.halving_doubling, "two_level": schedules.two_level,
           "ring_channels": schedules.ring_channels,
           "tree": lambda *args: schedules.tree(*args, pieces=tree_pieces)}[algorithm]
    time_s, steps = (0.0, 0) if world_size == 1 else run(
        world_size, nbytes // element_size, element_size, net)
    return Simulation(algorithm, world_size, nbytes, links.name, time_s, tuple(net.bytes_sent),
                      tuple(net.messages_sent), steps, tuple(net.bytes_between_nodes))


@dataclass(frozen=True)
class SizeRange:
    """Tensor sizes (bytes, both ends included) for which ``algorithm`` is the fastest."""

    algorithm: str
    low_bytes: int
    high_bytes: int


def time_of(algorithm: str, world_size: int, nbytes: int, link: Link | str | Cluster,
            **options) -> float:
    """``simulate(...).time_s``, remembered: crossovers and plots ask again for sizes they
    have timed."""
    _whole_number(world_size, "world_size (the number of ranks)", 1)  # 2.0 is not 2 here
    _whole_number(nbytes, "nbytes (the tensor's size in bytes)", 0)
    return _remembered_time_s(algorithm, world_size, nbytes, get_links(link),
                              tuple(sorted(options.items())))


@lru_cache(maxsize=1 << 14)  # floats only: a few hundred kB when full
def _remembered_time_s(algorithm: str, world_size: int, nbytes: int, links: Link | Cluster,
                       options: tuple) -> float:
    return simulate(algorithm, world_size, nbytes, links, **dict(options)).time_s


def fastest(link: Link | str | Cluster, world_size: int, nbytes: int,
            algorithms: Sequence[str] = ANY_WORLD_SIZE, **options) -> str:
    """The algorithm with the shortest simulated time (the first listed, on a tie)."""
    times = {name: time_of(name, world_size, nbytes, link, **options) for name in algorithms}
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
               algorithms: Sequence[str] = ANY_WORLD_SIZE, element_size: int = FLOAT32,
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
