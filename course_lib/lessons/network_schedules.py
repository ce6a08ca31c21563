"""The schedules of ``course_lib.lessons.network_sim``: one function per all-reduce.

Each takes (N, elements, bytes per element, a ``links.Network``), plays the algorithm's messages
on the network (``Network.send``), or its steps for a ring, fills in what each rank sent, and
returns (seconds until the last rank holds the sum, steps). ``network_sim``'s docstring says
what each algorithm does and what the network model leaves out.
"""

from __future__ import annotations

from itertools import accumulate

from course_lib.lessons.links import Link, Network


def chunk_sizes(numel: int, parts: int) -> list[int]:
    """Elements per chunk, cut as ``collectives.chunk_bounds`` cuts: the first numel % parts
    chunks get one element more."""
    base, extra = divmod(numel, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def naive(n: int, numel: int, element_size: int, net: Network) -> tuple[float, int]:
    size = numel * element_size
    total = 0.0
    for src in range(1, n):  # rank 0 takes one tensor at a time, in rank order, and adds it
        total = net.send(src, 0, size, 0.0, add=True)
    finished = total
    for dst in range(1, n):  # then sends the sum out, one copy after another
        finished = net.send(0, dst, size, total)
    return finished, 2 * (n - 1)


def recursive_doubling(n: int, numel: int, element_size: int,
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


def halving_doubling(n: int, numel: int, element_size: int,
                     net: Network) -> tuple[float, int]:
    """Rabenseifner's all-reduce on chunk_bounds' N chunks. Reduce-scatter, distance 1, 2, ...:
    before the swap at distance d, rank r holds the chunks c with c = r (mod d); it keeps those
    with c = r (mod 2d), half of them, and sends its partner r XOR d the other half, which the
    partner adds. At the end rank r holds the sum of chunk r. The all-gather swaps the same
    halves back, distance N/2 down to 1."""
    base, bigger = divmod(numel, n)  # chunk_bounds: the first `bigger` chunks have base + 1

    def chunks_bytes(residue: int, modulus: int) -> int:  # the chunks c = residue (mod modulus)
        return (base * (n // modulus) + len(range(residue, bigger, modulus))) * element_size

    distances = [1 << k for k in range(n.bit_length() - 1)]  # 1, 2, .., N/2: log2(N) rounds
    ready = [0.0] * n
    for d, adds in [(d, True) for d in distances] + [(d, False) for d in distances[::-1]]:
        before = list(ready)  # both partners send what they held before the swap
        for r in range(n):  # r receives what it keeps (reduce-scatter), or what it lacks
            partner = r ^ d
            held_by = r if adds else partner  # the halves are the chunks = r or = partner
            ready[r] = net.send(partner, r, chunks_bytes(held_by % (2 * d), 2 * d),
                                before[partner], add=adds)
    return max(ready), 2 * len(distances)


def ring_bytes(numel: int, n: int, element_size: int) -> list[int]:
    """Bytes each rank of a ring of n sends: every chunk but its own, then every chunk but its
    right neighbour's, counted without looping over every send (ring_viz.bytes_sent_per_rank
    counts them one by one)."""
    if n == 1:
        return [0]
    base, bigger = divmod(numel, n)  # chunk_bounds: the first `bigger` chunks have base + 1
    diff = [0] * (n + 1)  # extra bytes per rank, as differences: each step adds a stretch
    for shift in (1, 0):  # reduce-scatter, then all-gather
        for step in range(n - 1):
            # rank r sends chunk (r - step - shift) mod N (ring_viz.send_chunk), so the ranks
            # that send one of the bigger chunks 0 .. bigger-1 start at rank step + shift
            _around_the_ring(diff, (step + shift) % n, bigger, element_size)
    return [2 * (n - 1) * base * element_size + more for more in accumulate(diff[:n])]


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


def ring(n: int, numel: int, element_size: int, net: Network) -> tuple[float, int]:
    """Step by step: each step lasts as long as its slowest message (Network.ring_step_s)."""
    base, bigger = divmod(numel, n)
    small, big = base * element_size, (base + 1) * element_size
    total = 0.0
    for shift, adds in ((1, True), (0, False)):  # reduce-scatter, then all-gather
        for step in range(n - 1):
            total += net.ring_step_s((step + shift) % n, bigger, big, small)
            total += net.add_s(big if bigger else small) if adds else 0.0
    net.bytes_sent = ring_bytes(numel, n, element_size)
    net.messages_sent = [2 * (n - 1)] * n
    leaving = [net.leaves_node(r, (r + 1) % n) for r in range(n)]  # the last rank of a node
    net.bytes_between_nodes = [b if out else 0 for b, out in zip(net.bytes_sent, leaving,
                                                                 strict=True)]
    return total, 2 * (n - 1)


def _ring_phase_s(link: Link, net: Network, steps: int, largest: int, adds: bool) -> float:
    """Steps of a ring whose largest message is ``largest`` bytes, on one kind of link."""
    return steps * (link.message_s(largest) + (net.add_s(largest) if adds else 0.0))


def two_level(n: int, numel: int, element_size: int, net: Network) -> tuple[float, int]:
    """A ring in each node (L ranks), then rings across the nodes (G), then in each node again.

    Rank r = g L + i (node g, place i in its node). The node's reduce-scatter leaves the node's
    sum of chunk i on it; the L rings across nodes, one per i, all-reduce chunk i (of the L
    chunks) among the G ranks that hold it, all at once on their own links; the node's
    all-gather then hands every finished chunk round the node.
    """
    cluster = net.cluster
    per_node = cluster.ranks_per_node
    nodes = n // per_node
    inside = chunk_sizes(numel, per_node)  # elements of chunk i, held by place i in each node
    in_node = ring_bytes(numel, per_node, element_size)  # by place in the node
    across = [ring_bytes(c, nodes, element_size) for c in inside]  # [place][node]
    biggest_in = inside[0] * element_size
    biggest_across = -(-inside[0] // nodes) * element_size  # ring 0 carries the largest chunk
    time_s = (_ring_phase_s(cluster.inside, net, per_node - 1, biggest_in, adds=True)
              + _ring_phase_s(cluster.between, net, nodes - 1, biggest_across, adds=True)
              + _ring_phase_s(cluster.between, net, nodes - 1, biggest_across, adds=False)
              + _ring_phase_s(cluster.inside, net, per_node - 1, biggest_in, adds=False))
    net.bytes_between_nodes = [across[r % per_node][r // per_node] for r in range(n)]
    net.bytes_sent = [in_node[r % per_node] + net.bytes_between_nodes[r] for r in range(n)]
    steps = 2 * (per_node - 1) + 2 * (nodes - 1)
    net.messages_sent = [steps] * n
    return time_s, steps


def ring_channels(n: int, numel: int, element_size: int, net: Network) -> tuple[float, int]:
    """A flat ring in L channels, one per adapter, as NCCL runs its rings on nodes of L ranks.

    The tensor is cut into L parts (as chunk_bounds cuts); part c goes round its own ring of
    all N ranks. Ring c visits each node's places c+1, c+2, .., c (mod L), so it leaves every
    node from place c: each rank is the exit of one ring, on its own adapter. Rank g L + i
    always sends to place i+1 of its node, except in ring i, where it sends to the next node.
    The rings step together: in one step a rank sends ring i's chunk between nodes and the
    other L-1 rings' chunks to its neighbour in the node, at once (one latency, their bytes).
    A step lasts as long as its slowest message, counted with the largest chunk.
    """
    per_node = net.cluster.ranks_per_node
    nodes = n // per_node
    parts = chunk_sizes(numel, per_node)  # elements of each ring's part
    biggest = -(-parts[0] // n) * element_size  # ring 0's largest chunk: the largest of all
    inside, between = net.cluster.inside, net.cluster.between
    if nodes == 1:  # every ring closes inside the node: all L chunks go to the same neighbour
        step_s = inside.message_s(per_node * biggest)
    else:  # one chunk over the adapter; the other L-1 to the neighbour in the node, at once
        step_s = max(between.message_s(biggest),
                     inside.message_s((per_node - 1) * biggest) if per_node > 1 else 0.0)
    add_s = net.add_s(per_node * biggest)  # a rank adds one chunk of each ring
    time_s = (n - 1) * (step_s + add_s) + (n - 1) * step_s  # reduce-scatter, then all-gather
    net.bytes_sent, net.bytes_between_nodes = [0] * n, [0] * n
    for c, part in enumerate(parts):
        sent = ring_bytes(part, n, element_size)  # by position on ring c
        for g in range(nodes):
            for j in range(per_node):  # position g L + j is place (c + 1 + j) mod L
                rank = g * per_node + (c + 1 + j) % per_node
                net.bytes_sent[rank] += sent[g * per_node + j]
                if j == per_node - 1 and nodes > 1:  # ring c leaves the node from place c
                    net.bytes_between_nodes[rank] += sent[g * per_node + j]
    net.messages_sent = [2 * (n - 1) * per_node] * n  # one per ring per step
    return time_s, 2 * (n - 1)


def tree(n: int, numel: int, element_size: int, net: Network,
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
