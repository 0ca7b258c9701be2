"""The executor: run a pipeline schedule for real, one rank per stage, and log every step.

Why: the simulator says what *should* happen; here it happens. Each rank holds its
stage's layers of the chapter's network (hidden layers 1-3 and the output layer, one per
stage on A1, A2, B1, B2), follows its row of ``pipeline_order`` step by step, and moves
activations forward and errors backward with ``dist.send``/``dist.recv``. Every rank logs
what it computed and sent; :func:`execute` returns the logs and the gradients, and checks
both: the log against the simulation, the gradients against one process training on the
whole batch. Each rank also times every action and every send/recv
(:func:`parlab.comm.span`); :meth:`Execution.chrome_trace` puts the ranks' spans on one
timeline, the real counterpart of the simulated Gantt chart.

No deadlock, on any backend: in each step's communication phase every rank walks the
same globally ordered list of that step's transfers and does its part (send if it is
the source, recv if it is the destination). The earliest unfinished transfer always has
both of its ranks waiting on it, so the phase always completes, even with blocking sends
and with transfers going both ways between two ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from parlab.comm import chrome_trace, recording, span
from parlab.pipeline.schedules import Schedule, _check_count
from parlab.pipeline.simulator import Event, Simulation, StageTransfer, simulate

__all__ = ["Network", "Execution", "execute", "reference", "run_stages", "stage_layers",
           "max_difference"]


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
        _check_count("samples", self.samples, "samples in the batch")

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


def stage_layers(net: Network, virtual_stages: int, stage: int) -> range:
    """Which layers (0-based) (virtual) stage ``stage`` holds: an equal, contiguous share."""
    _check_count("stages", virtual_stages, "pipeline stages x chunks")
    if virtual_stages > net.layers:
        raise ValueError(f"stages={virtual_stages} is more than the network's {net.layers} "
                         f"layers: every stage needs at least one layer")
    if net.layers % virtual_stages:
        raise ValueError(f"the network's {net.layers} layers do not split evenly over "
                         f"{virtual_stages} stages x chunks; choose a divisor of {net.layers}")
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < virtual_stages:
        raise ValueError(f"stage must be in 0..{virtual_stages - 1}, got {stage!r}")
    per = net.layers // virtual_stages
    return range(stage * per, (stage + 1) * per)


def _split(sched: Schedule, x, target):
    m = sched.microbatches
    if x.shape[0] % m:
        raise ValueError(f"the batch of {x.shape[0]} samples does not split into "
                         f"{m} equal micro-batches; use a multiple of {m} samples")
    return list(x.chunk(m)), list(target.chunk(m))


def run_stages(sched: Schedule, net: Network, me: int, peers: list[int], x, target,
               transfers_by_step: list[list[StageTransfer]]):
    """Run pipeline rank ``me``'s row of the schedule; ``peers[r]`` is pipeline rank r's
    global rank. Returns {"events", "grads": {layer: (dW, db)}, "loss" (this rank's share),
    "traffic": per step, the messages the toy backend logged as sent by this rank (or None
    on other backends), "spans": this rank's timed actions (compute, named by the action,
    such as "2F0") and sends/receives (communication, with bytes and the peer's global
    rank)}."""
    from parlab.launch import rank_device
    device = rank_device()  # this rank's GPU under NCCL, else the CPU
    K = sched.virtual_stages
    layers = [layer.to(device) for layer in net.build()]
    x, target = x.to(device), target.to(device)
    mine = {k: list(stage_layers(net, K, k)) for k in range(K) if sched.rank_of(k) == me}
    modules = {k: torch.nn.Sequential(*(layers[j] for j in js)) for k, js in mine.items()}
    x_mbs, t_mbs = _split(sched, x, target)
    width = lambda k: net.widths[stage_layers(net, K, k).stop]  # width of stage k's output
    inbox, saved, outbox, events = {}, {}, {}, []
    loss_total = torch.zeros((), device=device)
    toy_log = _toy_log()
    traffic, seen = ([] if toy_log else None), 0
    with recording() as recorder:
        for step in range(sched.steps):
            step_events = {}  # (kind of what it sends, stage, micro-batch) -> log line
            for action in sched.actions(me, step):
                k, i = action.stage, action.microbatch
                with span(str(action), "compute", step=step + 1, stage=k, kind=action.kind,
                          microbatch=i):
                    if action.kind == "F":
                        inp = x_mbs[i] if k == 0 else inbox.pop(("y", k - 1, i))
                        inp = inp.detach().requires_grad_(k > 0)
                        out = modules[k](inp)
                        if k == K - 1:
                            out = net.loss(out, t_mbs[i], x.shape[0])
                            loss_total += out.detach()
                        saved[(k, i)] = (inp, out)
                        produced, target_stage, kind = out.detach(), k + 1, "y"
                    else:
                        inp, out = saved.pop((k, i))
                        out.backward(None if k == K - 1 else inbox.pop(("E", k + 1, i)))
                        produced, target_stage, kind = (inp.grad if k > 0 else None), k - 1, "E"
                if 0 <= target_stage < K:
                    if sched.rank_of(target_stage) == me:  # the next chunk is here: no transfer
                        inbox[(kind, k, i)] = produced
                    else:
                        outbox[(kind, k, i)] = produced
                step_events[(kind, k, i)] = [step + 1, me, str(action), None]
            for transfer in transfers_by_step[step]:  # the same global order on every rank
                key = (transfer.kind, transfer.src_stage, transfer.microbatch)
                if transfer.src == me:
                    tensor = outbox.pop(key).contiguous()
                    with _transfer_span("send", transfer, peers[transfer.dst], tensor, step):
                        dist.send(tensor, peers[transfer.dst])
                    step_events[key][3] = transfer  # logged once it has really been sent
                elif transfer.dst == me:
                    buffer = torch.empty(x_mbs[transfer.microbatch].shape[0],
                                         width(min(transfer.src_stage, transfer.dst_stage)),
                                         device=device)
                    with _transfer_span("recv", transfer, peers[transfer.src], buffer, step):
                        dist.recv(buffer, peers[transfer.src])
                    inbox[key] = buffer
            events += [Event(*e) for e in step_events.values()]
            if toy_log:  # what the backend itself logged in this step's communication phase
                log = toy_log()
                traffic.append([r for r in log[seen:] if r.src == peers[me]])
                seen = len(log)
    grads = {j: (layers[j][0].weight.grad.cpu(), layers[j][0].bias.grad.cpu())
             for js in mine.values() for j in js}
    return {"events": events, "grads": grads, "loss": float(loss_total), "traffic": traffic,
            "spans": recorder.spans}


def _transfer_span(op: str, transfer: StageTransfer, peer: int, tensor, step: int):
    """A communication span named after the action whose result moves: "send 2F0 -> 3"."""
    produced_by = f"{transfer.src_stage}{'F' if transfer.kind == 'y' else 'B'}{transfer.microbatch}"
    arrow = "->" if op == "send" else "<-"
    return span(f"{op} {produced_by} {arrow} {peer}", "communication", op=op, peer=peer,
                bytes=tensor.numel() * tensor.element_size(),
                tensor=f"{transfer.kind}{transfer.microbatch + 1}", step=step + 1)


def _toy_log():
    """The toy backend's per-rank message log function, when this group runs on it."""
    if dist.get_backend() != "toy":
        return None
    from parlab.comm.toy import transfers
    return transfers


def _stage_worker(sched: Schedule, net: Network, transfers_by_step):
    x, target = net.batch()
    return run_stages(sched, net, dist.get_rank(), list(range(sched.stages)), x, target,
                      transfers_by_step)


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


def max_difference(grads, ref) -> float:
    """Largest absolute difference between two {layer: (dW, db)} dicts over the same layers."""
    if set(grads) != set(ref):
        raise ValueError(f"gradients for layers {sorted(grads)} vs {sorted(ref)}")
    return max(float((a - b).abs().max()) for j in grads for a, b in zip(grads[j], ref[j]))


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

    @property
    def matches_simulation(self) -> bool:
        """Did every rank compute and send exactly what the simulated table says?"""
        return self.events == self.simulation.events()

    @property
    def max_grad_error(self) -> float:
        """Largest |pipeline gradient - single-process gradient| over all weights and biases."""
        return max_difference(self.grads, self.reference_grads)

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
            timeout: float = 60) -> Execution:
    """Run ``sched`` on ``sched.stages`` real ranks and compare it with the simulation and
    with single-process training. ``backend`` is "gloo" (CPU), "nccl" (one GPU per rank)
    or "toy", which also logs every message, step by step (``traffic_by_step``)."""
    net = net or Network()
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
                                            timeout=timeout)
    else:
        from parlab.launch import run
        results = run(_stage_worker, sched.stages, sched, net, by_step, backend=backend,
                      timeout=timeout)
    events = sorted((e for r in results for e in r["events"]), key=lambda e: (e.step, e.rank))
    grads = {j: g for r in results for j, g in r["grads"].items()}
    ref_grads, ref_loss = reference(net)
    logged = None
    if backend == "toy":  # each step's messages, from every rank's own log
        logged = [sorted((m for r in results for m in r["traffic"][t]),
                         key=lambda m: (m.src, m.dst)) for t in range(sim.steps)]
    return Execution(sim, events, grads, sum(r["loss"] for r in results), ref_grads, ref_loss,
                     traffic, [r["events"] for r in results], logged, net,
                     [r["spans"] for r in results])
