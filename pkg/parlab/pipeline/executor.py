"""The executor: run a pipeline schedule for real, one rank per stage, and log every step.

Why: the simulator says what *should* happen; here it happens. Each rank holds its
stage's layers of the chapter's network (hidden layers 1-3 and the output layer, one per
stage on A1, A2, B1, B2) and runs them through the one executor,
:func:`parlab.pipeline.runner.run_schedule`, which follows its row of the schedule step by
step and moves activations forward and errors backward with ``dist.send``/``dist.recv``
(the 3D job runs its tensor-parallel GPT stages through the same function). Every rank logs
what it computed and sent; :func:`execute` returns the logs and the gradients, and checks
both: the log against the simulation, the gradients against one process training on the
whole batch. Given a learning rate, each rank then updates its layers' weights (plain SGD)
after its own last backward, and :meth:`Execution.update_table` says when each rank did
and where the next iteration could start (a synchronous flush). Each rank also times every
action and every send/recv (:func:`parlab.launch.span`); :meth:`Execution.chrome_trace` puts
the ranks' spans on one timeline, the real counterpart of the simulated Gantt chart.

The runner's docstring says why no schedule can deadlock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from parlab.comm import chrome_trace
from parlab.checks import check_count, check_positive_number
from parlab.models import max_difference
from parlab.pipeline.runner import run_schedule, split_layers
from parlab.pipeline.schedules import Schedule
from parlab.pipeline.simulator import Event, Simulation, StageTransfer, simulate

__all__ = ["Network", "Execution", "execute", "reference", "reference_step", "run_network",
           "stage_layers"]


@dataclass(frozen=True)
class Network:
    """The chapter's network: ``widths`` = inputs, hidden layer sizes..., outputs.

    Layer j is ``Linear(widths[j], widths[j+1])``, followed by a sigmoid for hidden layers.
    Weights and the batch (``samples`` inputs with their targets) come from ``seed``, so
    every rank builds the same model and data. The loss is the squared error summed over
    outputs and averaged over all samples of the batch; a micro-batch's share is its
    samples' sum divided by the batch size, so the shares add up to the batch loss.
    """

    widths: tuple = (3, 4, 4, 4, 2)
    samples: int = 8
    seed: int = 0

    def __post_init__(self):
        w = self.widths
        if not isinstance(w, (tuple, list)) or len(w) < 2 or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in w):
            raise ValueError(f"widths must be inputs, hidden sizes..., outputs: two or more "
                             f"whole numbers >= 1, got {w!r}")
        check_count("samples", self.samples, "samples in the batch")

    @property
    def layers(self) -> int:
        return len(self.widths) - 1

    def build(self) -> list[torch.nn.Module]:
        """The layers, with deterministic weights (the same on every rank)."""
        generator = torch.Generator().manual_seed(self.seed)
        layers = []
        for j in range(self.layers):
            linear = torch.nn.Linear(self.widths[j], self.widths[j + 1])
            with torch.no_grad():
                bound = self.widths[j] ** -0.5
                linear.weight.copy_((torch.rand(linear.weight.shape, generator=generator)
                                     * 2 - 1) * bound)
                linear.bias.copy_((torch.rand(linear.bias.shape, generator=generator)
                                   * 2 - 1) * bound)
            hidden = j < self.layers - 1
            layers.append(torch.nn.Sequential(linear, torch.nn.Sigmoid()) if hidden
                          else torch.nn.Sequential(linear))
        return layers

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs ``x`` (samples x inputs) and targets (samples x outputs)."""
        generator = torch.Generator().manual_seed(self.seed + 1)
        x = torch.rand(self.samples, self.widths[0], generator=generator)
        target = torch.rand(self.samples, self.widths[-1], generator=generator)
        return x, target

    def loss(self, output, target, batch_samples: int) -> torch.Tensor:
        """This micro-batch's share of the batch loss."""
        return ((output - target) ** 2).sum() / batch_samples

    def layer_name(self, j: int) -> str:
        """Layer ``j`` (0-based) in the book's words: "hidden layer 1", ..., "output layer"."""
        return "output layer" if j == self.layers - 1 else f"hidden layer {j + 1}"


def stage_layers(net: Network, virtual_stages: int, stage: int) -> range:
    """Which layers (0-based) (virtual) stage ``stage`` holds: an equal, contiguous share."""
    return split_layers(net.layers, virtual_stages, stage, what="network")


def _split(sched: Schedule, x, target):
    m = sched.microbatches
    if x.shape[0] % m:
        raise ValueError(f"the batch of {x.shape[0]} samples does not split into "
                         f"{m} equal micro-batches; use a multiple of {m} samples")
    return list(x.chunk(m)), list(target.chunk(m))


def run_network(sched: Schedule, net: Network, x, target, *, peers=None, group=None,
                transfers_by_step=None, batch_samples: int | None = None,
                lr: float | None = None) -> dict:
    """This rank's part of ``sched`` on the chapter's network, through :func:`run_schedule`.

    ``x``/``target`` are the samples this pipeline trains on; ``batch_samples`` the size of
    the whole batch the loss is averaged over (default: ``len(x)``). Returns {"events",
    "grads": {layer: (dW, db)}, "loss" (this rank's share), "traffic" (per step, the
    messages the toy backend logged as sent by this rank, or None on other backends),
    "spans" (this rank's timed actions and sends/receives)}; with ``lr``, also "updated":
    {layer: (W, b)} after one SGD step on this rank's layers, once its schedule is done.
    """
    from parlab.launch import rank_device
    device = rank_device()
    K, me = sched.virtual_stages, _pipeline_rank(peers)
    layers = [layer.to(device) for layer in net.build()]
    modules = {k: torch.nn.Sequential(*(layers[j] for j in stage_layers(net, K, k)))
               for k in range(K) if sched.rank_of(k) == me}
    x_mbs, t_mbs = _split(sched, x, target)
    samples = x.shape[0] if batch_samples is None else batch_samples
    width = lambda k: net.widths[stage_layers(net, K, k).stop]  # width of stage k's output
    done = run_schedule(sched, modules, x_mbs, t_mbs,
                        lambda out, t: net.loss(out, t, samples),
                        lambda k, i: (x_mbs[i].shape[0], width(k)),
                        peers=peers, group=group, transfers_by_step=transfers_by_step)
    mine = [j for k in modules for j in stage_layers(net, K, k)]
    grads = {j: (layers[j][0].weight.grad.cpu(), layers[j][0].bias.grad.cpu()) for j in mine}
    result = {"events": done.events, "grads": grads, "loss": done.loss,
              "traffic": done.traffic, "spans": done.spans}
    if lr is not None:  # the flush: every micro-batch's gradient is in, so update now
        torch.optim.SGD([q for j in mine for q in layers[j].parameters()], lr=lr).step()
        result["updated"] = {j: (layers[j][0].weight.detach().cpu().clone(),
                                 layers[j][0].bias.detach().cpu().clone()) for j in mine}
    return result


def _pipeline_rank(peers) -> int:
    rank = dist.get_rank()
    return rank if peers is None else list(peers).index(rank)


def _stage_worker(sched: Schedule, net: Network, transfers_by_step, lr=None):
    x, target = net.batch()
    return run_network(sched, net, x, target, transfers_by_step=transfers_by_step, lr=lr)


def reference(net: Network, x=None, target=None):
    """Single-process training on the whole batch: ({layer: (dW, db)}, loss)."""
    if x is None:
        x, target = net.batch()
    model = torch.nn.Sequential(*net.build())
    loss = net.loss(model(x), target, x.shape[0])
    loss.backward()
    grads = {j: (layer[0].weight.grad.clone(), layer[0].bias.grad.clone())
             for j, layer in enumerate(model)}
    return grads, float(loss.detach())


def reference_step(net: Network, lr: float) -> dict:
    """One process, whole batch, one SGD step: {layer: (W, b)} after it."""
    model = torch.nn.Sequential(*net.build())
    x, target = net.batch()
    net.loss(model(x), target, x.shape[0]).backward()
    with torch.no_grad():  # SGD written out: torch.optim would import torch._dynamo (seconds)
        for p in model.parameters():
            p.add_(p.grad, alpha=-lr)
    return {j: (layer[0].weight.detach().clone(), layer[0].bias.detach().clone())
            for j, layer in enumerate(model)}


@dataclass
class Execution:
    """What :func:`execute` ran and found."""

    simulation: Simulation
    events: list[Event]
    grads: dict
    loss: float
    reference_grads: dict
    reference_loss: float
    traffic: object = None
    per_rank_events: list = field(default_factory=list, repr=False)
    traffic_by_step: list | None = field(default=None, repr=False)
    net: Network = field(default_factory=Network, repr=False)
    spans: list = field(default_factory=list, repr=False)  # spans[r]: rank r's timed work
    lr: float | None = None                      # the SGD step after the batch, if any
    updated: dict | None = field(default=None, repr=False)            # {layer: (W, b)}
    reference_updated: dict | None = field(default=None, repr=False)  # one process's step

    @property
    def matches_simulation(self) -> bool:
        """Did every rank compute and send exactly what the simulated table says?"""
        return self.events == self.simulation.events()

    @property
    def max_grad_error(self) -> float:
        """Largest ``|pipeline gradient - single-process gradient|`` over all weights and
        biases."""
        return max_difference(self.grads, self.reference_grads)

    def gradient_table(self) -> str:
        """Per layer: its GPU, and the gradients one backward pass computes there (one per
        weight on a neuron's inputs, plus one for its bias)."""
        sched, names = self.simulation.schedule, self.simulation.names
        K = sched.virtual_stages
        gpu = {j: names[sched.rank_of(k)] for k in range(K) for j in stage_layers(self.net, K, k)}
        lines = []
        for j, (dw, db) in sorted(self.grads.items()):
            lines.append(f"{gpu[j]}  {self.net.layer_name(j):<14}  {dw.shape[0]} neurons x "
                         f"({dw.shape[1]} input weights + 1 bias) = "
                         f"{dw.numel() + db.numel()} gradients")
        return "\n".join(lines)

    @property
    def max_update_error(self) -> float:
        """Largest ``|weight after the ranks' SGD step - weight after one process's step|``."""
        if self.updated is None:
            raise ValueError("no weight update: run execute(..., lr=...)")
        return max_difference(self.updated, self.reference_updated)

    def update_table(self) -> str:
        """Per rank: its last backward, its weight update, and where the next iteration's first
        forward could run under a synchronous flush (:meth:`Simulation.next_iteration`)."""
        if self.updated is None:
            raise ValueError("no weight update: run execute(..., lr=...)")
        sim = self.simulation
        header = (f"{'GPU':<4} {'last backward':<14} {'weights updated':<16} "
                  f"{'next iteration starts':<22} idle steps between")
        lines = [header]
        for rank, (last, first) in enumerate(sim.next_iteration()):
            lines.append(f"{sim.names[rank]:<4} {f'step {last}':<14} {f'after step {last}':<16} "
                         f"{f'step {first}':<22} {first - last - 1}")
        lines.append(f"updated weights equal one process's SGD step (lr {self.lr:g}) on the "
                     f"whole batch, to 1e-6: {self.max_update_error < 1e-6}")
        return "\n".join(lines)

    def expected_bytes(self, transfer: StageTransfer) -> int:
        """Bytes of the tensor a transfer carries: micro-batch samples x boundary width x 4."""
        K, samples = self.simulation.schedule.virtual_stages, self.net.samples
        width = self.net.widths[stage_layers(self.net, K, min(transfer.src_stage,
                                                             transfer.dst_stage)).stop]
        return samples // self.simulation.schedule.microbatches * width * 4

    @property
    def traffic_matches(self) -> bool:
        """Did the toy backend log, step by step, exactly the simulated communication list?"""
        if self.traffic_by_step is None:
            raise ValueError("no per-step traffic: run execute(..., backend='toy')")
        expected = [sorted((t.src, t.dst, self.expected_bytes(t)) for t in rec.transfers)
                    for rec in self.simulation.records]
        logged = [[(m.src, m.dst, m.nbytes) for m in step] for step in self.traffic_by_step]
        return logged == expected

    def traffic_table(self) -> str:
        """Per step: the chapter's communication list, and what the toy backend logged."""
        if self.traffic_by_step is None:
            raise ValueError("no per-step traffic: run execute(..., backend='toy')")
        from parlab.pipeline.notation import transfer_label
        sim, names = self.simulation, self.simulation.names
        lines = []
        for rec, logged in zip(sim.records, self.traffic_by_step):
            wanted = ", ".join(transfer_label(sim, t) for t in rec.transfers) or "-"
            seen = ", ".join(f"{names[m.src]}->{names[m.dst]} {m.nbytes} B" for m in logged) or "-"
            lines.append(f"step {rec.step:2d}  simulated: {wanted}\n          toy backend: {seen}")
        return "\n".join(lines)

    def log_text(self, rank: int) -> str:
        """What ``rank`` logged, one line per action, with the book's GPU names."""
        names = self.simulation.names
        lines = [f"log of {names[rank]} (rank {rank}):"]
        for e in self.per_rank_events[rank]:
            sent = (f", then sent {e.sent.kind}{e.sent.microbatch + 1} to {names[e.sent.dst]}"
                    if e.sent else "")
            lines.append(f"  step {e.step:2d}: {e.action}{sent}")
        return "\n".join(lines)

    def chrome_trace(self, path=None) -> dict:
        """The ranks' real timeline as a Chrome trace (one track per rank, rows "compute" and
        "communication", arrows from each send to its recv); also written to ``path`` (a
        ``.json`` or ``.json.gz`` name) when given: open it at https://ui.perfetto.dev."""
        return chrome_trace(self.spans, self.simulation.names, path)

    def report(self) -> str:
        """Three lines a notebook can print (floats rounded, so the output is stable)."""
        sim = self.simulation
        return "\n".join([
            f"{sim.schedule.name} on {sim.schedule.stages} ranks: {sim.steps} time steps, "
            f"{len(self.events)} actions, {sum(e.sent is not None for e in self.events)} transfers",
            f"log equals the simulated table: {self.matches_simulation}",
            f"loss {self.loss:.6f} (single process {self.reference_loss:.6f}); largest "
            f"gradient difference below 1e-6: {self.max_grad_error < 1e-6}",
        ])


def execute(sched: Schedule, net: Network | None = None, backend: str | None = "gloo",
            timeout: float = 60, lr: float | None = None) -> Execution:
    """Run ``sched`` on ``sched.stages`` real ranks and compare it with the simulation and
    with single-process training. ``backend`` is "gloo" (CPU), "nccl" (one GPU per rank)
    or "toy", which also logs every message, step by step (``traffic_by_step``). With
    ``lr``, each rank then takes one SGD step on its layers (``Execution.updated``)."""
    net = net or Network()
    if lr is not None:
        check_positive_number("lr", lr, "learning rate")
    if not isinstance(net, Network):
        raise TypeError(f"net must be a parlab.pipeline.Network, got {type(net).__name__}")
    sim = simulate(sched)
    stage_layers(net, sched.virtual_stages, 0)  # a clear error before any rank starts
    _split(sched, *net.batch())
    by_step = [rec.transfers for rec in sim.records]
    traffic = None
    if backend == "toy":
        from parlab.comm import run_with_traffic
        results, traffic = run_with_traffic(_stage_worker, sched.stages, sched, net, by_step,
                                            lr, timeout=timeout)
    else:
        from parlab.launch import run
        results = run(_stage_worker, sched.stages, sched, net, by_step, lr, backend=backend,
                      timeout=timeout)
    events = sorted((e for r in results for e in r["events"]), key=lambda e: (e.step, e.rank))
    grads = {j: g for r in results for j, g in r["grads"].items()}
    ref_grads, ref_loss = reference(net)
    logged = None
    if backend == "toy":  # each step's messages, from every rank's own log
        logged = [sorted((m for r in results for m in r["traffic"][t]),
                         key=lambda m: (m.src, m.dst)) for t in range(sim.steps)]
    updated = None if lr is None else {j: w for r in results for j, w in r["updated"].items()}
    return Execution(sim, events, grads, sum(r["loss"] for r in results), ref_grads, ref_loss,
                     traffic, [r["events"] for r in results], logged, net,
                     [r["spans"] for r in results], lr, updated,
                     None if lr is None else reference_step(net, lr))
