"""Where the GPUs sit and what connects them: GPU names, servers, NVLink, rails and the spine.

The chapter's Figure 8-19 shows the layout used by large training clusters, called
*rail-optimized*: GPUs in a server talk over NVLink (the book's High-speed Domain, HsD);
each GPU also has its own network card (NIC), and the k-th NIC of every server plugs into
the same switch, rail switch k. So GPUs with the same position in different servers are one
switch apart. A message between rails (A1 to B2) has two ways (:meth:`Topology.route`), both
in the book: through a spine switch between the rail switches, or over the High-speed Domain
to the GPU of its own server that sits on the destination's rail, which sends it along that
rail (NCCL calls this relay PXN, "PCI x NVLink").

Names follow the figure: the letter is the GPU's position inside its server, which is
also its rail (A on rail 1, B on rail 2, ...); the number is its server. A1, A2, A3 share
rail 1; A1 and B1 share server 1 and talk over NVLink. Rank r is GPU r of a server-major
numbering: with 2 GPUs per server, ranks 0..5 are A1, B1, A2, B2, A3, B3.

Link numbers (:class:`LinkSpec`: latency alpha in seconds, bandwidth in bytes/s per
direction) are round figures for an H100-class cluster; they are assumptions to make
the arithmetic concrete, change them freely:

- NVLink: 450 GB/s per direction per GPU. NVIDIA quotes 900 GB/s of total (both
  directions) NVLink bandwidth for H100 SXM (fourth-generation NVLink, 18 links).
  alpha = 1 us: assumed order of magnitude of a small GPU-to-GPU transfer through NVSwitch.
- NIC to a rail switch: 100, 200 or 400 Gb/s, i.e. 12.5, 25 or 50 GB/s per direction
  (400 Gb/s is a ConnectX-7 / NDR InfiniBand port; 8 bits per byte, protocol overhead
  ignored). alpha = 2 us: assumed RDMA latency through one switch (a switch hop itself
  is well under a microsecond; NIC and software add the rest).
- Spine: the same NICs, alpha = 3 us for the two extra switch hops (rail -> spine ->
  rail). The spine is assumed non-blocking: it adds latency, never contention.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field, replace

from parlab.hardware import NIC_GBPS, NIC_SPEEDS_GBPS, NVLINK_GB_PER_S
from parlab.checks import check_count, check_index

__all__ = ["LinkSpec", "NVLINK", "nic", "Topology", "rail_optimized", "figure_8_19",
           "gpu_name", "rank_of", "link_type", "LINK_TYPES", "ROUTES", "NETWORK_SWITCHES"]

LINK_TYPES = ("nvlink", "rail", "spine")

#: The two ways between rails: through the spine, or relayed over the High-speed Domain.
ROUTES = ("spine", "relay")

#: Network switches a message passes on each type of hop: none on NVLink (inside the
#: server), its rail switch, or rail switch, spine switch and the other rail switch.
NETWORK_SWITCHES = {"nvlink": 0, "rail": 1, "spine": 3}

@dataclass(frozen=True)
class LinkSpec:
    """A link type for the alpha-beta model: ``alpha`` s per message, ``bandwidth`` bytes/s."""

    name: str
    alpha: float
    bandwidth: float

    def time(self, nbytes: float) -> float:
        """Seconds for one message of ``nbytes`` alone on the link: alpha + bytes / bandwidth."""
        return self.alpha + nbytes / self.bandwidth


#: NVLink between GPUs of one server (see the module docstring for the numbers' sources).
NVLINK = LinkSpec("nvlink", alpha=1e-6, bandwidth=NVLINK_GB_PER_S * 1e9)


def nic(gbps: float = NIC_GBPS, hops: str = "rail") -> LinkSpec:
    """A NIC of ``gbps`` Gb/s, through one rail switch (``"rail"``) or through the spine."""
    if gbps <= 0:
        raise ValueError(f"a NIC needs a positive speed in Gb/s (usual: {NIC_SPEEDS_GBPS}), "
                         f"got {gbps}")
    if hops not in ("rail", "spine"):
        raise ValueError(f"hops must be 'rail' or 'spine', got {hops!r}")
    return LinkSpec(hops, alpha=2e-6 if hops == "rail" else 3e-6, bandwidth=gbps * 1e9 / 8)


def gpu_name(rank: int, gpus_per_server: int = 8) -> str:
    """The figure's name of ``rank``: letter = position in the server (= rail), number = server."""
    _check_layout(gpus_per_server)
    check_index("rank", rank)
    server, position = divmod(rank, gpus_per_server)
    return f"{string.ascii_uppercase[position]}{server + 1}"


def rank_of(name: str, gpus_per_server: int = 8) -> int:
    """The rank of a GPU name such as ``"B2"`` (the inverse of :func:`gpu_name`)."""
    _check_layout(gpus_per_server)
    letter, number = name[:1].upper(), name[1:]
    position = string.ascii_uppercase.find(letter) if letter else -1
    if not number.isdigit() or int(number) < 1 or not 0 <= position < gpus_per_server:
        raise ValueError(f"{name!r} is not a GPU name for servers of {gpus_per_server} GPUs: "
                         f"use a letter A..{string.ascii_uppercase[gpus_per_server - 1]} and a "
                         f"server number from 1, e.g. 'A1'")
    return (int(number) - 1) * gpus_per_server + position


def _check_layout(gpus_per_server):
    if not isinstance(gpus_per_server, int) or not 1 <= gpus_per_server <= 26:
        raise ValueError(f"gpus_per_server must be an int from 1 to 26 (one letter each), "
                         f"got {gpus_per_server!r}")


def _as_rank(gpu, gpus_per_server) -> int:
    return rank_of(gpu, gpus_per_server) if isinstance(gpu, str) else gpu


def link_type(src, dst, gpus_per_server: int = 8) -> str:
    """``"nvlink"`` inside a server, ``"rail"`` between servers on one rail, else ``"spine"``.

    ``src`` and ``dst`` are ranks or names ("A1").
    """
    _check_layout(gpus_per_server)
    src, dst = _as_rank(src, gpus_per_server), _as_rank(dst, gpus_per_server)
    if src == dst:
        raise ValueError(f"a GPU does not send to itself over a link (src = dst = {src})")
    if src // gpus_per_server == dst // gpus_per_server:
        return "nvlink"
    return "rail" if src % gpus_per_server == dst % gpus_per_server else "spine"


@dataclass(frozen=True)
class Topology:
    """``servers`` x ``gpus_per_server`` GPUs, rail-optimized, with a LinkSpec per link type."""

    servers: int
    gpus_per_server: int
    links: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return self.servers * self.gpus_per_server

    def names(self) -> list[str]:
        """Every GPU's name, in rank order."""
        return [gpu_name(r, self.gpus_per_server) for r in range(self.size)]

    def gpu_name(self, rank: int) -> str:
        self._check_rank(rank)
        return gpu_name(rank, self.gpus_per_server)

    def server(self, rank: int) -> int:
        """The server (1-based, as in the names) that holds ``rank``."""
        self._check_rank(rank)
        return rank // self.gpus_per_server + 1

    def rail(self, rank: int) -> int:
        """The rail switch (1-based) that ``rank``'s NIC plugs into."""
        self._check_rank(rank)
        return rank % self.gpus_per_server + 1

    def link_type(self, src, dst) -> str:
        src, dst = _as_rank(src, self.gpus_per_server), _as_rank(dst, self.gpus_per_server)
        self._check_rank(src)
        self._check_rank(dst)
        return link_type(src, dst, self.gpus_per_server)

    def link(self, src, dst) -> LinkSpec:
        """The LinkSpec of the path from ``src`` to ``dst``."""
        return self.links[self.link_type(src, dst)]

    def route(self, src, dst, via: str = "spine") -> list[tuple[int, int, str]]:
        """The hops of a message from ``src`` to ``dst``: ``[(from, to, link type), ...]``.

        Inside a server or along one rail there is one way, one hop. Between rails ``via``
        picks the way: ``"spine"`` is one hop through the spine (the message leaves by
        ``src``'s NIC); ``"relay"`` is two hops, NVLink to the GPU of ``src``'s server on
        ``dst``'s rail, then that GPU's NIC along the rail (NCCL's PXN).
        """
        if via not in ROUTES:
            raise ValueError(f"via must be one of {ROUTES}, got {via!r}")
        src, dst = _as_rank(src, self.gpus_per_server), _as_rank(dst, self.gpus_per_server)
        kind = self.link_type(src, dst)
        if kind != "spine" or via == "spine":
            return [(src, dst, kind)]
        relay = src - src % self.gpus_per_server + dst % self.gpus_per_server
        return [(src, relay, "nvlink"), (relay, dst, "rail")]

    def with_nic(self, gbps: float) -> Topology:
        """The same cluster with NICs of ``gbps`` Gb/s."""
        return replace(self, links={**self.links, "rail": nic(gbps, "rail"),
                                    "spine": nic(gbps, "spine")})

    def _check_rank(self, rank):
        if not isinstance(rank, int) or not 0 <= rank < self.size:
            raise ValueError(f"rank {rank!r} is not in this topology of {self.size} GPUs "
                             f"({self.servers} servers x {self.gpus_per_server})")

    def __str__(self) -> str:
        nic_gbps = self.links["rail"].bandwidth * 8 / 1e9
        return (f"{self.servers} servers x {self.gpus_per_server} GPUs, rail-optimized, "
                f"NVLink {self.links['nvlink'].bandwidth / 1e9:g} GB/s, NICs {nic_gbps:g} Gb/s")


def rail_optimized(servers: int, gpus_per_server: int = 8, nic_gbps: float = NIC_GBPS,
                   nvlink: LinkSpec = NVLINK) -> Topology:
    """A rail-optimized cluster: NVLink inside servers, one NIC per GPU to its rail switch."""
    _check_layout(gpus_per_server)
    check_count("servers", servers, "servers in the cluster")
    links = {"nvlink": nvlink, "rail": nic(nic_gbps, "rail"), "spine": nic(nic_gbps, "spine")}
    return Topology(servers, gpus_per_server, links)


def figure_8_19(nic_gbps: float = NIC_GBPS) -> Topology:
    """Figure 8-19's cluster: 3 servers of 2 GPUs; A1-A2-A3 on rail 1, B1-B2-B3 on rail 2."""
    return rail_optimized(3, 2, nic_gbps)
