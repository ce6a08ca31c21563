"""Named links, nodes of ranks, and a network of N ranks (the simulator of notebook 06b,
``course_lib.lessons.network_sim``).

A link is what one rank has to the others: a bandwidth per direction (full duplex: it can send
and receive at that rate at the same time) and a latency, the fixed cost of one message.
A ``Cluster`` puts the ranks in nodes: a fast link between the ranks of one node, a slower one
between nodes. ``Network`` keeps, for each rank, when its sending and receiving sides are next
free, and what it sent.

    from course_lib.lessons.links import LINKS, Cluster, get_link, link_from_model
    get_link("InfiniBand NDR 400 Gb/s").bandwidth_bytes_per_s   # 50e9
    link_from_model(model)        # this machine, from notebook 05's fitted alpha and beta
    Cluster(8, "NVLink 4 (H100)", "InfiniBand NDR 400 Gb/s")   # 8 GPUs per node

Bandwidths are the vendors' published peak figures, per direction, after line encoding; real
transfers reach somewhat less. Vendors rarely publish a latency for one message end to end
(it depends on the software, the switches and the distance), so each entry says whether its
latency is a vendor figure or an order-of-magnitude assumption.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.lessons.cost_model import AlphaBeta


@dataclass(frozen=True)
class Link:
    """One rank's full-duplex link: a message of n bytes takes latency_s + n / bandwidth."""

    name: str
    bandwidth_bytes_per_s: float  # each direction
    latency_s: float  # per message, whatever its size

    def message_s(self, nbytes: float) -> float:
        """Seconds one message of ``nbytes`` bytes occupies a sender's and a receiver's link."""
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


PCIE_ENCODING = 128 / 130  # PCIe 3.0 to 5.0 send 128 data bits in every 130 on the wire

LINKS = {link.name: link for link in (
    # PCI-SIG, PCI Express Base Specification 4.0: 16 GT/s per lane, 128b/130b encoding
    # (PCI-SIG quotes 64 GB/s for x16, both directions together).
    # Latency: no vendor figure; 1 us is an order-of-magnitude assumption.
    Link("PCIe 4.0 x16", 16e9 * 16 / 8 * PCIE_ENCODING, 1e-6),
    # PCI-SIG, PCI Express Base Specification 5.0 announcement: 32 GT/s per lane, "up to
    # 128 GB/s via x16" (both directions together), 128b/130b encoding.
    # Latency: no vendor figure; 1 us is an order-of-magnitude assumption.
    Link("PCIe 5.0 x16", 32e9 * 16 / 8 * PCIE_ENCODING, 1e-6),
    # NVIDIA H100 Tensor Core GPU datasheet (SXM): NVLink 900 GB/s per GPU, both directions
    # together over 18 fourth-generation links, so 450 GB/s each way.
    # Latency: no vendor figure; 1 us is an order-of-magnitude assumption.
    Link("NVLink 4 (H100)", 900e9 / 2, 1e-6),
    # NVIDIA ConnectX-7 adapter user manual: one port of NDR 400 Gb/s, i.e. 50 GB/s each way.
    # Latency: that manual gives none; assumed equal to the ConnectX-6 figure below.
    Link("InfiniBand NDR 400 Gb/s", 400e9 / 8, 600e-9),
    # NVIDIA ConnectX-6 adapter user manual: ports of HDR 200 Gb/s (25 GB/s each way) and
    # "sub-600ns latency" (a vendor figure for the adapter; switches and software add more).
    Link("InfiniBand HDR 200 Gb/s", 200e9 / 8, 600e-9),
)}


def get_link(link: Link | str) -> Link:
    """A ``Link`` as it is, or the named one from ``LINKS``."""
    if isinstance(link, Link):
        return link
    if link not in LINKS:
        raise ValueError(f"unknown link {link!r}; pass a Link or one of {sorted(LINKS)}")
    return LINKS[link]


def link_from_model(model: AlphaBeta, name: str = "this machine") -> Link:
    """The link notebook 05's fit describes: latency alpha, bandwidth 1 / beta."""
    if not model.beta_s_per_byte > 0:
        raise ValueError("the model needs beta_s_per_byte > 0 (a finite bandwidth)")
    return Link(name, model.bandwidth_bytes_per_s, model.alpha_s)


@dataclass(frozen=True)
class Cluster:
    """Ranks in nodes of ``ranks_per_node``, numbered node by node (node = rank // per node).

    A message between two ranks of one node takes the ``inside`` link, between two nodes the
    ``between`` link. Each rank has one link of each kind, as each GPU of an H100 server has its
    NVLink ports and an InfiniBand adapter of its own; switches never slow anything down.
    """

    ranks_per_node: int
    inside: Link | str
    between: Link | str

    def __post_init__(self) -> None:
        if isinstance(self.ranks_per_node, bool) or not isinstance(self.ranks_per_node, int) \
                or self.ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be a whole number >= 1, got "
                             f"{self.ranks_per_node!r}")
        object.__setattr__(self, "inside", get_link(self.inside))  # names become Links
        object.__setattr__(self, "between", get_link(self.between))

    @property
    def name(self) -> str:
        return (f"{self.ranks_per_node} per node, {self.inside.name} inside, "
                f"{self.between.name} between")

    def same_node(self, a: int, b: int) -> bool:
        return a // self.ranks_per_node == b // self.ranks_per_node

    def link(self, a: int, b: int) -> Link:
        """The link a message from rank a to rank b takes."""
        return self.inside if self.same_node(a, b) else self.between


def get_links(links: Link | str | Cluster) -> Link | Cluster:
    """A ``Cluster`` as it is; otherwise ``get_link``'s Link."""
    return links if isinstance(links, Cluster) else get_link(links)


class Network:
    """N ranks on one kind of link, or in a ``Cluster``'s nodes: when each side of each rank is
    next free, and what each rank sent (all of it, and the part that left its node).

    ``course_lib.lessons.network_sim`` plays the all-reduce schedules on it.
    """

    def __init__(self, world_size: int, links: Link | Cluster,
                 reduce_bytes_per_s: float | None) -> None:
        self.world_size, self.links = world_size, links
        self.reduce_bytes_per_s = reduce_bytes_per_s
        self.send_free = [0.0] * world_size
        self.receive_free = [0.0] * world_size  # the receiver's add included
        self.bytes_sent = [0] * world_size
        self.bytes_between_nodes = [0] * world_size  # the part of bytes_sent that left the node
        self.messages_sent = [0] * world_size
        self.cluster = links if isinstance(links, Cluster) else None

    def leaves_node(self, a: int, b: int) -> bool:
        """Whether a message from rank a to rank b leaves a's node (never on one kind of link)."""
        return self.cluster is not None and not self.cluster.same_node(a, b)

    def add_s(self, nbytes: int) -> float:
        return nbytes / self.reduce_bytes_per_s if self.reduce_bytes_per_s else 0.0

    def send(self, src: int, dst: int, nbytes: int, ready_s: float, add: bool = False) -> float:
        """Send once the data is ready and both sides are free; returns when dst is done."""
        cluster = self.cluster
        link = self.links if cluster is None else cluster.link(src, dst)
        start = max(ready_s, self.send_free[src], self.receive_free[dst])
        arrived = start + link.message_s(nbytes)
        done = arrived + self.add_s(nbytes) if add else arrived
        self.send_free[src], self.receive_free[dst] = arrived, done
        self.bytes_sent[src] += nbytes
        self.messages_sent[src] += 1
        if cluster is not None and not cluster.same_node(src, dst):
            self.bytes_between_nodes[src] += nbytes
        return done

    def ring_step_s(self, first_big: int, bigger: int, big: int, small: int) -> float:
        """How long one step of a ring of all N ranks lasts (rank r sends to r + 1): as long as
        its slowest message. Ranks first_big .. first_big + bigger - 1 (mod N) send ``big``
        bytes, the others ``small``."""
        cluster = self.cluster
        if cluster is None:
            return self.links.message_s(big if bigger else small)
        per_node, n = cluster.ranks_per_node, self.world_size
        nodes = n // per_node
        # the last rank of each node sends to the next node; count those among the big senders
        leaving_big = len(range((per_node - 1 - first_big) % per_node, bigger, per_node))
        if nodes == 1:
            leaving_big = 0  # one node: the ring closes inside it
        leaving = nodes if nodes > 1 else 0
        sends = [(cluster.between, big, leaving_big > 0),
                 (cluster.between, small, leaving_big < leaving),
                 (cluster.inside, big, bigger - leaving_big > 0),
                 (cluster.inside, small, n - bigger - (leaving - leaving_big) > 0)]
        return max(link.message_s(size) for link, size, used in sends if used)
