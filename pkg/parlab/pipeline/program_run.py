"""Any schedule's program trained on real ranks: chapter 03's network, several SGD steps.

:func:`execute_program` runs a :class:`parlab.pipeline.Program` (1F1B, ZB-H1, ZBV,
DualPipeV, ...) through the one executor, :func:`parlab.pipeline.run_schedule`, on
``prog.stages`` ranks: each rank builds the stages it holds (one, or two in a V: rank r
holds stages r and 2p - 1 - r), runs its actions in the program's order, then takes a plain
SGD step on its weights (``w <- w - lr dL/dw``) once its last W is done, and starts the next
iteration. It returns what a check needs: the loss and the gradients of every iteration,
the weights at the end, and each rank's log of what it computed and sent.

A rank's log names every action it ran, W included, in order; the simulator's
:meth:`parlab.pipeline.Timeline.order` says what that order must be. DualPipeV's overlapped
pairs (F&B) run as their forward, then their full backward: CPU ranks have no second stream
to overlap them on, and this network no expert all-to-all for the overlap to hide.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from parlab.checks import check_count, check_positive_number
from parlab.pipeline.executor import Network, stage_layers
from parlab.pipeline.programs import Program
from parlab.pipeline.runner import run_schedule
from parlab.pipeline.split_backward import program_steps

__all__ = ["ProgramRun", "execute_program", "execute_programs"]


@dataclass
class ProgramRun:
    """What :func:`execute_program` found.

    ``losses[n]`` and ``grads[n]`` (``{layer: (dW, db)}``) are iteration n's batch loss and
    gradients, ``weights`` (``{layer: (W, b)}``) the weights after the last SGD step;
    ``events[n][r]`` is rank r's log in iteration n (:class:`parlab.pipeline.Event`: step,
    rank, action, what it sent); ``spans[n][r]`` its timed work; ``traffic[n][r]``, on the
    toy backend, per step the messages the backend logged as sent by rank r (else None).
    """

    program: Program
    losses: list
    grads: list
    weights: dict
    events: list = field(repr=False)
    spans: list = field(default_factory=list, repr=False)
    traffic: list = field(default_factory=list, repr=False)

    def order(self, iteration: int = 0) -> dict[int, list[str]]:
        """Each rank's executed actions in ``iteration``, in the order it ran them."""
        return {r: [e.action for e in log] for r, log in enumerate(self.events[iteration])}

    def sent(self, iteration: int = 0) -> list:
        """Every transfer between ranks in ``iteration`` (stages on one rank send nothing)."""
        return [e.sent for log in self.events[iteration] for e in log if e.sent is not None]


def _programs_worker(progs: list, net: Network, lr: float, iterations: int, dtype):
    # one launch runs every program: starting the ranks costs more than these small runs
    return [_train(prog, net, lr, iterations, dtype) for prog in progs]


def _train(prog: Program, net: Network, lr: float, iterations: int, dtype) -> dict:
    me, K = dist.get_rank(), prog.virtual_stages
    layers = [layer.to(dtype) for layer in net.build()]
    modules = {k: torch.nn.Sequential(*(layers[j] for j in stage_layers(net, K, k)))
               for k in prog.stages_of(me)}
    mine = [j for k in modules for j in stage_layers(net, K, k)]
    x, target = (t.to(dtype) for t in net.batch())
    x_mbs, t_mbs = list(x.chunk(prog.microbatches)), list(target.chunk(prog.microbatches))
    width = lambda k: net.widths[stage_layers(net, K, k).stop]  # stage k's output width
    out = {"losses": [], "grads": [], "events": [], "spans": [], "traffic": []}
    for _ in range(iterations):
        for j in mine:
            layers[j].zero_grad(set_to_none=True)
        done = run_schedule(prog, modules, x_mbs, t_mbs,
                            lambda y, t: net.loss(y, t, x.shape[0]),
                            lambda k, i: (x_mbs[i].shape[0], width(k)), dtype=dtype)
        out["grads"].append({j: (layers[j][0].weight.grad.clone(),
                                 layers[j][0].bias.grad.clone()) for j in mine})
        with torch.no_grad():  # SGD by hand: torch.optim would import torch._dynamo (seconds)
            for j in mine:
                for q in layers[j].parameters():
                    q -= lr * q.grad
        out["losses"].append(done.loss)
        out["events"].append(done.events)
        out["spans"].append(done.spans)
        out["traffic"].append(done.traffic)
    out["weights"] = {j: (layers[j][0].weight.detach().clone(), layers[j][0].bias.detach().clone())
                      for j in mine}
    return out


def execute_program(prog: Program, net: Network | None = None, lr: float = 0.1,
                    iterations: int = 2, dtype: torch.dtype = torch.float64,
                    backend: str = "gloo", timeout: float = 60) -> ProgramRun:
    """Train ``net`` (default: chapter 03's) with ``prog`` on ``prog.stages`` real ranks.

    Each of ``iterations`` runs the whole batch through the program and takes one SGD step
    (learning rate ``lr``) in ``dtype``. ``backend`` is "gloo" or "toy" (which also records
    every message). The program and the network are checked before any rank starts: the
    program must be able to run (:func:`parlab.pipeline.timeline`), the network's layers
    must split evenly over its stages and its samples over the micro-batches.
    """
    return execute_programs([prog], net, lr, iterations, dtype, backend, timeout)[0]


def execute_programs(progs, net: Network | None = None, lr: float = 0.1, iterations: int = 2,
                     dtype: torch.dtype = torch.float64, backend: str = "gloo",
                     timeout: float = 60) -> list[ProgramRun]:
    """:func:`execute_program` for several programs on the same ranks, in one launch."""
    progs = list(progs)
    for prog in progs:
        if not isinstance(prog, Program):
            raise ValueError(f"execute_program needs a Program (parlab.pipeline.program), got "
                             f"{type(prog).__name__}; run a Schedule with parlab.pipeline.execute")
    if not progs or len({prog.stages for prog in progs}) != 1:
        raise ValueError(f"give one or more programs on the same number of ranks, got ranks "
                         f"{[prog.stages for prog in progs]}")
    net = net or Network()
    if not isinstance(net, Network):
        raise TypeError(f"net must be a parlab.pipeline.Network, got {type(net).__name__}")
    check_positive_number("lr", lr, "learning rate")
    check_count("iterations", iterations, "SGD steps")
    for prog in progs:
        stage_layers(net, prog.virtual_stages, 0)  # layers split evenly over the stages
        if net.samples % prog.microbatches:
            raise ValueError(f"the batch of {net.samples} samples does not split into "
                             f"{prog.microbatches} equal micro-batches; use a multiple of "
                             f"{prog.microbatches} samples")
        program_steps(prog)  # a program that cannot run is a ValueError here, not on a rank
    from parlab.launch import run
    results = run(_programs_worker, progs[0].stages, progs, net, lr, iterations, dtype,
                  backend=backend, timeout=timeout)
    return [_gathered(prog, [r[n] for r in results], iterations) for n, prog in enumerate(progs)]


def _gathered(prog: Program, results: list, iterations: int) -> ProgramRun:
    """One program's ranks' results as one :class:`ProgramRun`."""
    return ProgramRun(
        prog, [sum(r["losses"][n] for r in results) for n in range(iterations)],
        [{j: g for r in results for j, g in r["grads"][n].items()} for n in range(iterations)],
        {j: w for r in results for j, w in r["weights"].items()},
        [[r["events"][n] for r in results] for n in range(iterations)],
        [[r["spans"][n] for r in results] for n in range(iterations)],
        [[r["traffic"][n] for r in results] for n in range(iterations)])
