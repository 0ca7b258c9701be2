"""Choose the data, tensor and pipeline degrees for a model on a cluster: the 3D-parallel planner.

Why this module exists: the slide decks end with "combine them", and someone must pick the
numbers. :func:`plan` does what a person would do with chapters 01-04 open: for every way of
writing the GPU count as dp x tp x pp, and every number of micro-batches, it asks

- *does it fit?* memory per GPU from :func:`parlab.memory.estimate` (the busiest stage);
- *how long does a step take?* compute from FLOPs, the pipeline bubble from
  :mod:`parlab.pipeline`, and the time of every message from the alpha-beta model of
  :mod:`parlab.comm.cost` on the links :mod:`parlab.hybrid.placement` puts each group on;

then keeps the layouts that fit, sorted by step time. ``layout.explain()`` says in words why
the winner wins, ``layout.placement()`` where each rank runs.

The model is a GPT or Llama-style config, its name (``"Llama-3-8B"``) or a Hugging Face
``config.json`` (a dict or a path). What the planner assumes (the batch, the GPU's speed,
recomputation, the links...) is listed in :mod:`parlab.hybrid.assumptions`; every assumption
is a keyword of :func:`plan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from parlab.hardware import NIC_GBPS, gpu_memory
from parlab import memory
from parlab.memory import Breakdown
from parlab.units import format_bytes
from parlab.models import count_parameters, get_config
from parlab.comm import Mesh
from parlab.hybrid.assumptions import Assumptions, bubble_fraction, split_problem
from parlab.hybrid.placement import cluster, group_links, place
from parlab.tensor_parallel import divisors
from parlab.comm import Topology
from parlab.hybrid.step import micro_batch_efficiency, step_times, useful_flops
from parlab.checks import check_count

__all__ = ["Layout", "Rejected", "Search", "plan", "search", "evaluate", "table"]


@dataclass(frozen=True)
class Rejected:
    """A (dp, tp, pp) that no micro-batch count can rescue, and why."""

    dp: int
    tp: int
    pp: int
    kind: str                        # "split" (degrees vs model/server), "memory" or "batch"
    reason: str
    memory: Breakdown | None = None  # the smallest footprint, when memory is the reason


@dataclass(frozen=True)
class Layout:
    """One evaluated layout: degrees, micro-batches, memory per GPU and the parts of a step."""

    config: object                # a TransformerConfig or a LlamaConfig
    dp: int
    tp: int
    pp: int
    microbatches: int
    micro_batch: int              # sequences per micro-batch
    memory: Breakdown
    times: dict                   # TIME_PARTS -> seconds per step
    links: dict                   # "tensor" / "pipeline" / "data" -> link type (None: no group)
    topology: Topology
    assumptions: Assumptions
    context: "Search | None" = field(default=None, compare=False, repr=False)
    recompute: str | None = None  # this layout's activation recomputation
    efficiency: float = 1.0       # roofline share of compute-bound speed at this micro-batch

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def memory_per_gpu_bytes(self) -> int:
        return self.memory.total

    @property
    def fits(self) -> bool:
        return self.memory.fits

    @property
    def step_time_s(self) -> float:
        return sum(self.times.values())

    @property
    def bubble_fraction(self) -> float:
        return bubble_fraction(self.pp, self.microbatches, self.assumptions.schedule,
                               self.assumptions.virtual_stages)

    @property
    def parameters_per_stage(self) -> float:
        """The model's parameters over its pp pipeline stages, on average (the first and last
        stages also hold the embeddings and the head)."""
        return count_parameters(self.config)["total"] / self.pp

    @property
    def parameters_per_gpu(self) -> float:
        """One stage's share on one of its tp GPUs, on average: the parameters whose gradients
        each GPU all-reduces with its dp - 1 copies in other replicas every step."""
        return self.parameters_per_stage / self.tp

    @property
    def achieved_mfu(self) -> float:
        """Useful FLOPs per step over what the GPUs could do at peak in the step's time."""
        a = self.assumptions
        flops = useful_flops(self.config, self.tp, self.pp, self.micro_batch, a)
        return self.microbatches * flops / (a.gpu_tflops * 1e12 * self.step_time_s)

    @property
    def name(self) -> str:
        zero = f", ZeRO-{self.assumptions.zero}" if self.assumptions.zero else ""
        zero += f", {self.recompute} recompute" if self.recompute else ""
        return f"dp {self.dp} x tp {self.tp} x pp {self.pp}, m={self.microbatches}{zero}"

    def placement(self) -> list[int]:
        """The GPU of every rank (server-major index into :attr:`topology`), in rank order."""
        return place(self.dp, self.tp, self.pp, self.topology.gpus_per_server)

    @property
    def mesh(self) -> Mesh:
        """The rank grid of this layout (which rank is which replica, stage, tensor index)."""
        return Mesh(dp=self.dp, pp=self.pp, tp=self.tp)

    def placement_table(self, ranks: int = 16) -> str:
        """The first ``ranks`` ranks: replica, stage, tensor index, GPU name, server, rail."""
        check_count("ranks", ranks)
        gpu_of, mesh = self.placement(), self.mesh
        lines = ["rank  replica  stage  tensor  GPU   server  rail"]
        for rank in range(min(ranks, self.gpus)):
            c, g = mesh.coordinates(rank), gpu_of[rank]
            lines.append(f"{rank:>4}  {c.replica:>7}  {c.stage:>5}  {c.tensor:>6}  "
                         f"{self.topology.gpu_name(g):<4}  {self.topology.server(g):>6}  "
                         f"{self.topology.rail(g):>4}")
        if self.gpus > ranks:
            lines.append(f"... {self.gpus - ranks} more ranks")
        return "\n".join(lines)

    def row(self) -> dict:
        """The numbers of a table row (seconds and GB rounded for printing); a "recompute"
        column when the search tried recomputation."""
        tried = {"recompute": self.recompute or "off"} if "recompute" in self.times else {}
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "m": self.microbatches,
                "b": self.micro_batch, **tried,
                "memory GB": round(self.memory_per_gpu_bytes / 1e9, 1),
                "step s": round(self.step_time_s, 3),
                **{f"{k} s": round(v, 3) for k, v in self.times.items()},
                "MFU": round(self.achieved_mfu, 3)}

    def explain(self) -> str:
        """Why this layout, in plain words (compared with the others its search found)."""
        from parlab.hybrid.explain import explain
        return explain(self)

    def __str__(self) -> str:
        return (f"{self.name} (b={self.micro_batch}): {format_bytes(self.memory_per_gpu_bytes)}"
                f" per GPU, {self.step_time_s:.3f} s per step")


@dataclass
class Search:
    """Everything one :func:`search` looked at: evaluated layouts and rejected degrees."""

    config: object                # a TransformerConfig or a LlamaConfig
    gpus: int
    gpu_memory_gb: float
    topology: Topology
    assumptions: Assumptions
    layouts: list = field(default_factory=list)    # every evaluated layout, fitting or not
    rejected: list = field(default_factory=list)   # Rejected (dp, tp, pp)

    @property
    def ranked(self) -> list[Layout]:
        """The layouts that fit, fastest first.

        Ties (to the microsecond) go to fewer, larger micro-batches (the roofline model of
        :mod:`parlab.models.compute` is an upper bound for small ones), then to fewer
        pipeline stages.
        """
        fitting = [lay for lay in self.layouts if lay.fits]
        return sorted(fitting, key=lambda lay: (round(lay.step_time_s, 6), lay.microbatches,
                                                lay.pp, lay.tp, lay.recompute is not None))

    def space(self) -> dict[str, int]:
        """The size of the space searched: ``triples`` (ways to write the GPU count as
        dp x tp x pp), how many of them were dropped and why (``split``, ``memory``,
        ``batch``), ``evaluated`` (dp, tp, pp, micro-batches[, recompute]) layouts priced,
        and how many of those ``fit``."""
        count = lambda kind: sum(r.kind == kind for r in self.rejected)  # noqa: E731
        return {"triples": len(self.rejected) + len({(x.dp, x.tp, x.pp) for x in self.layouts}),
                "split": count("split"), "memory": count("memory"), "batch": count("batch"),
                "evaluated": len(self.layouts), "fit": len(self.ranked)}

    def summary(self) -> str:
        """How the search narrowed the candidates down, in one paragraph."""
        n = self.space()
        return (f"{self.config.name} on {self.gpus:,} GPUs of {self.gpu_memory_gb:g} GB: "
                f"{n['triples']} ways to "
                f"write {self.gpus} = dp x tp x pp; {n['split']} cannot split the model (tp must "
                f"divide the heads and d_ff and stay in a server, pp be at most the layers), "
                f"{n['memory']} do not fit even with one sequence per micro-batch, {n['batch']} "
                f"cannot split the batch of {self.assumptions.global_batch}; "
                f"{n['evaluated']} (dp, tp, pp, micro-batches) layouts evaluated, "
                f"{n['fit']} fit.")

    def best_per_degrees(self) -> dict[tuple, Layout]:
        """For each (dp, tp, pp) that fits, its fastest micro-batch count (and recompute)."""
        best: dict[tuple, Layout] = {}
        for lay in self.ranked:
            best.setdefault((lay.dp, lay.tp, lay.pp), lay)
        return best


def evaluate(config, dp: int, tp: int, pp: int, microbatches: int, gpu_memory_gb: float | None = None,
             topology: Topology | None = None, assumptions: Assumptions | None = None,
             **kwargs) -> Layout:
    """Memory and step time of one layout (fitting or not); keywords as in :func:`plan`, with
    one ``recompute`` setting (None, "full" or "selective"). ``gpu_memory_gb`` None: the
    capacity of the assumptions' ``gpu``; the default cluster has its NVLink."""
    config = get_config(config)
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("microbatches", microbatches)):
        check_count(name, value)  # before cluster(dp * tp * pp) would blame the product, "gpus"
    a = assumptions or _assumptions(kwargs)
    gpu_memory_gb = gpu_memory(a.gpu, gpu_memory_gb)
    if len(a.recompute_options) != 1:
        raise ValueError(f"evaluate prices one layout: give one recompute setting (None, "
                         f"'full' or 'selective'), got {a.recompute!r}; search() tries several")
    return _evaluate(config, dp, tp, pp, microbatches, gpu_memory_gb, topology, a,
                     a.recompute_options[0])


def _evaluate(config, dp, tp, pp, microbatches, gpu_memory_gb, topology, a: Assumptions,
              recompute) -> Layout:
    topology = topology or cluster(dp * tp * pp, gpu=a.gpu)
    per_server = min(topology.gpus_per_server, dp * tp * pp)
    problem = split_problem(config, tp, pp, per_server)
    if problem:
        raise ValueError(problem)
    shape = (a.global_batch, a.sequence(config))

    def per_gpu(zero):
        return memory.estimate(config, shape, a.optimizer, a.precision, dp, tp, pp, microbatches,
                               a.schedule, gpu_memory_gb, zero, recompute,
                               sequence_parallel=a.sequence_parallel,
                               virtual_stages=a.virtual_stages, stage_layers=a.stage_layers)

    breakdown = per_gpu(a.zero)
    whole = per_gpu(0) if a.zero else breakdown  # the exchange moves the whole gradient
    gpu_of = place(dp, tp, pp, topology.gpus_per_server)
    links = group_links(dp, tp, pp, topology, gpu_of)
    b = a.global_batch // (dp * microbatches)
    times = step_times(config, dp, tp, pp, microbatches, b, links, topology, a, whole.gradients,
                   recompute)
    return Layout(config, dp, tp, pp, microbatches, b, breakdown, times, links, topology, a,
                  recompute=recompute, efficiency=micro_batch_efficiency(config, b, tp, a))


def _assumptions(keywords: dict) -> Assumptions:
    """The :class:`Assumptions` the extra keywords give, naming any keyword that is none."""
    known = [f.name for f in fields(Assumptions)]
    for name in keywords:
        if name not in known:
            raise TypeError(f"unknown keyword {name!r}; the planner's assumptions are {known}")
    return Assumptions(**keywords)


def _stage_layers_problem(stage_layers, pp: int) -> str:
    """Why the assumptions' ``stage_layers`` cannot describe ``pp`` stages, or ''."""
    if stage_layers is None or len(stage_layers) == pp:
        return ""
    return f"stage_layers={list(stage_layers)} gives {len(stage_layers)} stages, not pp={pp}"


def _triples(gpus: int):
    for tp in divisors(gpus):
        for pp in divisors(gpus // tp):
            yield gpus // (tp * pp), tp, pp


def search(config, gpus: int, gpu_memory_gb: float | None = None, *, topology: Topology | None = None,
           nic_gbps: float = NIC_GBPS, gpus_per_server: int = 8, **assumptions) -> Search:
    """Evaluate every valid (dp, tp, pp, m) for ``config`` on ``gpus`` GPUs (see :func:`plan`)."""
    config = get_config(config)
    check_count("gpus", gpus)
    a = _assumptions(assumptions)
    gpu_memory_gb = gpu_memory(a.gpu, gpu_memory_gb)
    if not gpu_memory_gb > 0:
        raise ValueError(f"gpu_memory_gb must be positive, got {gpu_memory_gb!r}")
    if topology is None:
        topology = cluster(gpus, gpus_per_server, nic_gbps, gpu=a.gpu)
    elif topology.size < gpus:
        raise ValueError(f"the topology has {topology.size} GPUs, fewer than gpus={gpus}")
    result = Search(config, gpus, gpu_memory_gb, topology, a)
    per_server = min(topology.gpus_per_server, gpus)
    seq = a.sequence(config)
    for dp, tp, pp in _triples(gpus):
        fewest = memory.fewest_microbatches(a.schedule, pp)
        problem = (split_problem(config, tp, pp, per_server)
                   or _stage_layers_problem(a.stage_layers, pp)
                   or memory.v_problem(a.schedule, pp, fewest, config.n_layers)
                   or memory.interleave_problem(a.schedule, pp, 1, a.virtual_stages,
                                                config.n_layers))
        if problem:
            result.rejected.append(Rejected(dp, tp, pp, "split", problem))
            continue
        floors = {r: memory.estimate(config, (dp * fewest, seq), a.optimizer, a.precision, dp,
                                     tp, pp, fewest, a.schedule, gpu_memory_gb, a.zero, r,
                                     virtual_stages=a.virtual_stages,
                                     stage_layers=a.stage_layers)
                  for r in a.recompute_options}
        if not any(floor.fits for floor in floors.values()):
            floor = min(floors.values(), key=lambda f: f.total)
            result.rejected.append(Rejected(
                dp, tp, pp, "memory", f"even one sequence per micro-batch needs "
                                      f"{format_bytes(floor.total)} per GPU", floor))
            continue
        if a.global_batch % dp:
            result.rejected.append(Rejected(dp, tp, pp, "batch", f"dp={dp} does not divide "
                                                                 f"the global batch of "
                                                                 f"{a.global_batch}"))
            continue
        share = a.global_batch // dp
        counts = [m for m in (a.microbatches or divisors(share)) if not share % m]
        if counts and all(m < fewest for m in counts):
            result.rejected.append(Rejected(dp, tp, pp, "batch", memory.v_problem(
                a.schedule, pp, max(counts), config.n_layers)))
            continue
        counts = [m for m in counts if not memory.interleave_problem(
            a.schedule, pp, m, a.virtual_stages, config.n_layers)]
        for m in (m for m in counts if m >= fewest):
            for r in (r for r in a.recompute_options if floors[r].fits):
                lay = _evaluate(config, dp, tp, pp, m, gpu_memory_gb, topology, a, r)
                result.layouts.append(replace(lay, context=result))
    return result


def plan(config, gpus: int, gpu_memory_gb: float | None = None, *, topology: Topology | None = None,
         nic_gbps: float = NIC_GBPS, gpus_per_server: int = 8, **assumptions) -> list[Layout]:
    """The layouts of ``config`` on ``gpus`` GPUs that fit in ``gpu_memory_gb`` (None: the
    ``gpu``'s capacity, 80 GB for the default H100), fastest first.

    ``config`` is a GPT or Llama-style config (:mod:`parlab.models`), its name (``"GPT-3
    175B"``, ``"Llama-3-8B"``), or a Hugging Face ``config.json`` as a dict or a path. The
    cluster is ``topology``, or a rail-optimized one of servers of ``gpus_per_server`` GPUs
    with ``nic_gbps`` NICs. Other keywords are :class:`Assumptions` (global_batch, seq,
    precision, optimizer, gpu (a name in :data:`parlab.hardware.GPUS`), gpu_tflops, mfu,
    gpu_tb_per_s, schedule, virtual_stages (interleaved 1F1B), microbatches, zero,
    sequence_parallel, attention_flops, overlap_data_parallel, scatter_gather,
    recompute: None, "full", "selective", or a tuple of them such as ``(None, "full")`` to
    try each). Each
    layout has its degrees, recompute setting, memory and step time, ``placement()`` and
    ``explain()``; empty: nothing fits, :func:`search` says why.
    """
    return search(config, gpus, gpu_memory_gb, topology=topology, nic_gbps=nic_gbps,
                  gpus_per_server=gpus_per_server, **assumptions).ranked


def table(layouts, top: int = 10) -> str:
    """The first ``top`` layouts as aligned text: degrees, memory, step time and its parts."""
    check_count("top", top)
    layouts = list(layouts)[:top]
    if not layouts:
        return "(no layout fits)"
    rows = [lay.row() for lay in layouts]
    header = list(rows[0])
    cells = [[str(r[h]) for h in header] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    line = lambda items: "  ".join(s.rjust(w) for s, w in zip(items, widths))
    return "\n".join([line(header)] + [line(c) for c in cells])
