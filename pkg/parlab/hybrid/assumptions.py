"""What the planner takes as given, and what it needs to know about a model.

Why this module exists: :mod:`parlab.hybrid.planner` searches layouts; the numbers it takes
as given (the batch, the GPU's speed, the precision, recomputation...) and the few facts it
reads from a model (parameters, layers, heads, hidden size) live here, so that the search
stays short and a reader can find every assumption in one place. The assumptions (every
one is a keyword of :func:`parlab.hybrid.plan`; see :class:`Assumptions`):

- **Model**: a GPT (:class:`~parlab.models.TransformerConfig`) or a Llama-style
  (:class:`~parlab.models.LlamaConfig`) config, its name (``"GPT-3 175B"``,
  ``"Llama-3-8B"``), a Hugging Face ``config.json`` as a dict or a path (all read by
  :func:`parlab.models.get_config`). The planner reads its parameter count, layers, heads (and
  key/value heads), d_ff, hidden size d and context.
- **Work**: one step trains ``global_batch`` sequences of ``seq`` tokens (by default 1536 x
  2048, 3.1 M tokens: Narayanan et al.'s setting for GPT-3 175B in "Efficient Large-Scale
  Language Model Training on GPU Clusters Using Megatron-LM", 2021; the GPT-3 paper, Brown et
  al. 2020, Table 2.1, gives about 3.2 M tokens); training FLOPs = 6 x parameters x tokens
  (forward 2, backward 4; the attention-score FLOPs, a few percent at this length, are left
  out unless ``attention_flops=True``, which adds 3 x 4 T d per token and block, T the
  sequence: the forward's QK^T and weighted sum of V, and their two gradients; off by
  default so that the chapters' planned layouts keep their numbers); each GPU does 1/gpus of it at ``gpu_tflops`` x ``mfu`` (0.4: the share of peak a
  GPU sustains in large matrix multiplications) x the roofline efficiency of a micro-batch
  (:func:`parlab.models.block_matmul_efficiency`: a micro-batch of b x seq tokens keeps a
  block's weight products compute-bound only if their FLOPs per byte reach ``gpu_tflops /
  gpu_tb_per_s``, 295 on an H100, 153 on an A100; below that, the share is intensity /
  ridge). So small micro-batches cost compute time, large ones cost bubble and
  memory, and the search weighs the two; ``gpu_tb_per_s=math.inf`` switches the effect off.
  Bubbles and communication come on top, so the planner's own "achieved MFU" comes out lower.
- **GPU**: ``gpu`` names a card of :data:`parlab.hardware.GPUS` ("H100-80GB", the default,
  or "A100-80GB"); ``gpu_tflops`` (dense bf16 peak) and ``gpu_tb_per_s`` (HBM bandwidth)
  come from its datasheet unless given (then they override it), the planner's memory limit
  is its capacity (``gpu_memory_gb`` too, if it agrees: else a ValueError) and its default
  cluster's NVLink its NVLink speed.
- **Compute model**: ``compute_model="flat"`` (the default, what the chapters print) is
  the paragraph above. ``"kernels"`` prices a micro-batch's compute from its kernels
  instead (:mod:`parlab.models.kernels`, a Megatron-LM GPT layer): the weight products and
  the attention score products at ``matmul_tflops`` (the GPU's measured maximum achievable
  matmul speed, :data:`parlab.hardware.GPUS`; an override if given) x the roofline of each
  product's shape, and the memory-bound ops (layer norms, softmax, GeLU, dropout, residual
  adds) as their bytes over ``gpu_tb_per_s``; recomputation repeats the forward's kernels
  (all under "full", the attention core under "selective"). ``mfu`` is not used there (it
  is the flat model's one constant), and the attention score products follow
  ``attention_flops`` as above.
- **Memory**: whatever :func:`parlab.memory.estimate` counts: bf16 with Adam (16 bytes per
  parameter), activations of the micro-batches in flight; ``zero`` (ZeRO stage 0-3, chapter
  06) shards the model states over the dp replicas, and stage 3 makes the data-parallel
  traffic 1.5 times an all-reduce (stages 1-2 move the same bytes).
- **Recomputation**: ``recompute`` is None (keep every activation), ``"full"`` or
  ``"selective"`` (:data:`parlab.memory.RECOMPUTE`), or a tuple of them to try each. It
  changes the memory as :func:`parlab.memory.estimate` says and adds its forward FLOPs
  (:func:`parlab.memory.recompute_flops`) to each micro-batch, in a ``recompute`` part of
  the step; full recompute also repeats a block's two forward all-reduces under tensor
  parallelism. Not counted as useful work in the achieved MFU. The repeated forward
  includes the attention scores (4 T d FLOPs per token and block), which the 6 x
  parameters x tokens above leaves out, so at long sequences recomputation looks a little
  dearer next to the compute than it is.
- **Sequence parallelism**: ``sequence_parallel=True`` (Megatron's, chapter 08) splits the
  norm regions' activations over the tp GPUs (:func:`parlab.memory.estimate`); its
  all-gathers and reduce-scatters move the bytes of the all-reduces they replace (measured
  in chapter 08), so the step's time is unchanged. Context parallelism (``cp`` in
  :func:`parlab.memory.estimate`) is not among the planner's layouts yet.
- **Degrees**: tp divides the attention heads (and a Llama's key/value heads) and d_ff, and
  the GPUs of a server (tensor-parallel groups stay on NVLink); pp is at most the layers; dp x m
  divides the global batch; every micro-batch count m that divides a replica's share of the
  batch is tried.
- **Layers per stage**: ``stage_layers`` (a tuple of pp positive ints summing to the layers,
  as Megatron-LM's ``--decoder-first-pipeline-num-layers`` and
  ``--decoder-last-pipeline-num-layers`` set them; only layouts with that pp are tried), or
  None: as even as possible, the extra layers on the first stages (Llama-3-8B's 32 layers on
  pp=3: 11, 11, 10), so pp need not divide the layers (:mod:`parlab.memory.stages`). Memory
  prices each stage with its own layers. A pipeline runs at its slowest stage's pace, so a
  micro-batch's slot is the stage with the most layers: the compute, recompute and
  tensor-parallel time of a slot are the even split's times L/pp-layer stage scaled by
  max(stage_layers) x pp / L (the embedding and the head stay spread evenly, as before), and
  the bubble is that slot's share. An upper bound: with unequal stages the faster ones idle
  a little less than the slowest one's slot says (GPipe's step is Sum_k t_k + (m - 1) max_k
  t_k per pass, t_k stage k's time, not (m + pp - 1) max_k t_k).
- **Pipeline**: ``schedule`` 1F1B (or GPipe): a step of m micro-batches over pp stages lasts
  (m + pp - 1) slots, i.e. the busy time divided by 1 - bubble fraction, with the bubble
  fraction (pp-1)/(m+pp-1) of :func:`bubble_fraction`, checked against the simulator.
  ``"zb-h1"`` (Qi et al. 2024, chapter 09) splits each backward into B (input gradient) and
  W (weight gradient), taken as long as the forward each (one matrix product per weight,
  like the forward's), and defers W into the bubble: see :func:`bubble_fraction`. ``"zbv"``
  and ``"dualpipev"`` (chapter 09) place 2 pp chunks in a V, rank r holding chunks r and
  2 pp - 1 - r, so rank 0 holds the embeddings and the head; memory is counted per rank
  (:func:`parlab.memory.estimate`), each micro-batch crosses the pipeline's links twice as
  often (two chunks per rank send their activation and gradient), and layouts a V cannot
  run are skipped: 2 pp above the layers, or DualPipeV's m below 2 pp. DualPipe itself
  (both directions, two copies of the parameters) is not offered.
  ``virtual_stages`` v > 1 interleaves 1F1B (Narayanan et al. 2021, section 2.2.2): each
  rank holds v chunks of the model, the bubble shrinks to (p-1)/(v m + p - 1) of the step,
  each micro-batch crosses the pipeline's links v times as often, and the first rank holds
  pp (1 + (pp - 1)/(v pp)) micro-batches' activations (:mod:`parlab.memory.interleaved`);
  layouts whose layers per rank do not cut into v equal chunks are skipped.
- **Communication per micro-batch and stage** (nothing overlapped with compute by default: a
  conservative, simple model; ``overlap_data_parallel`` and ``scatter_gather`` are the two
  refinements of :mod:`parlab.hybrid.step`): Megatron's tensor parallelism all-reduces b x s x d values
  twice per block forward and twice backward, over the tensor group's link (NVLink); the
  pipeline sends one activation forward and one gradient back, b x s x d values each, over
  the pipeline's link (a rail); each of the tp GPUs of a stage sends its copy on its own NIC.
  After the last micro-batch, each stage all-reduces its gradients (ring) across the dp
  replicas, over their link (rails, or NVLink when replicas share a server).
- **Network**: :func:`parlab.comm.topology.rail_optimized`, servers of 8 GPUs, NVLink 450 GB/s,
  NICs of ``nic_gbps`` on rail switches, a non-blocking spine. Contention between groups
  that share a NIC is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from parlab import memory
from parlab import hardware
from parlab.models import MFU
from parlab.tensor_parallel import divisors
from parlab.checks import check_choice, check_count

__all__ = ["TIME_PARTS", "COMPUTE_MODELS", "Assumptions", "bubble_fraction", "split_problem"]

#: How a micro-batch's compute is priced: "flat" (FLOPs at mfu x roofline of peak) or
#: "kernels" (:mod:`parlab.models.kernels`; see the module docstring's "Compute model").
COMPUTE_MODELS = ("flat", "kernels")

#: What a step's time is made of, in the order the figures stack it ("recompute" only when
#: the search tries recomputation).
TIME_PARTS = ("compute", "recompute", "bubble", "tensor", "pipeline", "data")

#: How an error names each size tensor parallelism splits.
_SPLIT_WORDS = {"n_heads": "heads", "n_kv_heads": "key/value heads", "d_ff": "d_ff"}


def split_problem(config, tp: int, pp: int, per_server: int) -> str:
    """Why (tp, pp) cannot split ``config``, or '' when they can."""
    valid = [t for t in divisors(per_server) if not memory.tp_problem(config, t)]
    undivided = [f"the {n} {_SPLIT_WORDS[k]}" if k != "d_ff" else f"d_ff={n}"
                 for k, n in memory.tensor_split_sizes(config).items() if n % tp]
    if undivided:
        replicated = (" (Megatron-LM would replicate key/value heads; not modelled)"
                      if "key/value" in undivided[0] else "")
        return (f"tp={tp} does not divide {' and '.join(undivided)}{replicated} (valid tp "
                f"here: {valid})")
    if per_server % tp:
        return (f"tp={tp} does not fit inside a server of {per_server} GPUs (valid tp here: "
                f"{valid})")
    if pp > config.n_layers:
        return f"pp={pp} stages for the {config.n_layers} layers: at most one stage per layer"
    return ""


def _recompute_options(recompute) -> tuple:
    options = tuple(recompute) if isinstance(recompute, (tuple, list)) else (recompute,)
    if not options or len(set(options)) != len(options):
        raise ValueError(f"recompute must be one of {list(memory.RECOMPUTE)} or a tuple of "
                         f"distinct ones to try each, got {recompute!r}")
    for r in options:
        _check_recompute(r)
    return options


def _check_recompute(r) -> None:
    if not (r is None or (isinstance(r, str) and r in memory.RECOMPUTE)):
        raise ValueError(f"unknown recompute {r!r}; choose one of {list(memory.RECOMPUTE)}, "
                         f"or a tuple of them to try each, e.g. (None, 'full')")


@dataclass(frozen=True)
class Assumptions:
    """Everything the planner takes as given besides the model and the cluster."""

    global_batch: int = 1536          # sequences per step: Narayanan et al. 2021's GPT-3 run
    seq: int | None = None            # None: the model's context length
    precision: str = "bf16"
    optimizer: str = "adam"
    gpu: str | None = None            # a name in parlab.hardware.GPUS; None: "H100-80GB"
    gpu_tflops: float | None = None   # None: the gpu's dense bf16 peak (an override otherwise)
    mfu: float = MFU
    gpu_tb_per_s: float | None = None  # HBM bandwidth, the roofline's ridge; None: the gpu's
    schedule: str = "1f1b"
    microbatches: tuple | None = None  # None: every count that divides a replica's batch
    zero: int = 0                      # ZeRO stage of the data-parallel replicas
    recompute: str | tuple | None = None  # None, "full", "selective", or a tuple to try each
    sequence_parallel: bool = False    # Megatron's: norm regions split over the tp GPUs
    attention_flops: bool = False      # add the attention scores' FLOPs to the compute
    virtual_stages: int = 1            # interleaved 1F1B: model chunks per rank (schedule 1f1b)
    overlap_data_parallel: bool = False  # DDP buckets: the all-reduce hides behind a backward
    scatter_gather: bool = False       # pipeline sends 1/tp per NIC, all-gathered over NVLink
    stage_layers: tuple | None = None  # layers per stage (None: even, the extra ones first)
    compute_model: str = "flat"        # "flat" (mfu x roofline) or "kernels" (measured parts)
    matmul_tflops: float | None = None  # "kernels": None: the gpu's measured matmul ceiling

    def __post_init__(self):
        card = hardware.gpu(self.gpu)       # an unknown name: a ValueError listing GPUS
        for name, value in (("gpu_tflops", card.bf16_tflops), ("gpu_tb_per_s", card.hbm_tb_per_s),
                            ("matmul_tflops", card.matmul_tflops)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        check_count("global_batch", self.global_batch, "sequences per step")
        if self.seq is not None:
            check_count("seq", self.seq)  # 0 would silently mean the model's context
        m = self.microbatches
        if m is not None and not isinstance(m, (tuple, list)):
            raise TypeError(f"microbatches must be a tuple of micro-batch counts (None: every "
                            f"count that divides a replica's batch), got {m!r}; write ({m!r},)")
        if m is not None and (not m or any(isinstance(x, bool) or not isinstance(x, int)
                                           or x < 1 for x in m)):
            raise ValueError(f"microbatches must hold one or more positive integers, got {m!r}")
        if self.precision not in memory.PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of "
                             f"{list(memory.PRECISIONS)}")
        if self.optimizer not in memory.OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of "
                             f"{list(memory.OPTIMIZERS)}")
        if not self.gpu_tflops > 0 or not 0 < self.mfu <= 1:
            raise ValueError(f"gpu_tflops must be positive and mfu in (0, 1], got "
                             f"{self.gpu_tflops!r} and {self.mfu!r}")
        if isinstance(self.gpu_tb_per_s, bool) or not isinstance(self.gpu_tb_per_s, (int, float)) \
                or not self.gpu_tb_per_s > 0:
            raise ValueError(f"gpu_tb_per_s must be a positive memory bandwidth in TB/s "
                             f"(math.inf: every micro-batch compute-bound), got "
                             f"{self.gpu_tb_per_s!r}")
        check_choice("zero", self.zero, memory.ZERO_STAGES)
        check_choice("compute_model", self.compute_model, COMPUTE_MODELS)
        if isinstance(self.matmul_tflops, bool) or not isinstance(self.matmul_tflops, (int, float)) \
                or not self.matmul_tflops > 0:
            raise ValueError(f"matmul_tflops must be a positive speed in TFLOP/s, got "
                             f"{self.matmul_tflops!r}")
        if self.schedule not in memory.ESTIMATED_SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; choose one of "
                             f"{list(memory.ESTIMATED_SCHEDULES)}")
        _recompute_options(self.recompute)
        problem = memory.interleave_problem(self.schedule, 1, 1, self.virtual_stages, None)
        if problem:
            raise ValueError(problem)
        if self.stage_layers is not None:
            n = self.stage_layers
            if not isinstance(n, (tuple, list)):
                raise TypeError(f"stage_layers must be a tuple of layer counts, one per "
                                f"pipeline stage (None: as even as possible), got {n!r}")
            object.__setattr__(self, "stage_layers", tuple(n))
            # the counts themselves, against the model: memory.check_stage_layers
            memory.rank_layers(sum(n), len(n), self.schedule, self.virtual_stages, n)
        for name in ("sequence_parallel", "attention_flops", "overlap_data_parallel",
                     "scatter_gather"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")

    @property
    def device(self) -> hardware.GPU:
        """The GPU's datasheet (:data:`parlab.hardware.GPUS`)."""
        return hardware.gpu(self.gpu)

    @property
    def recompute_options(self) -> tuple:
        """The recompute settings each layout is tried with: ``(None,)`` by default."""
        return _recompute_options(self.recompute)

    def sequence(self, config) -> int:
        return self.seq or config.context


def bubble_fraction(pp: int, microbatches: int, schedule: str = "1f1b",
                    virtual_stages: int = 1) -> float:
    """Idle share of a pipeline's (GPU, slot) cells: (p-1)/(m+p-1) for GPipe and 1F1B.

    Interleaved 1F1B (``virtual_stages`` v > 1; Narayanan et al. 2021, section 2.2.2): each
    action is a chunk, 1/v of a stage, and the schedule of :func:`parlab.pipeline.schedule`
    lasts 2 (v max(m, p) + min(m, p) - 1) chunk slots in which each rank is busy 2 m v: the
    bubble fraction is (p-1)/(v m + p - 1) from m = p on (the paper's bubble over ideal time,
    (p-1)/(v m), over 1 + that), and ((p - m) v + m - 1)/(v p + m - 1) with fewer
    micro-batches than stages (a test holds both to the simulator).

    The same number :func:`parlab.pipeline.simulator` counts on the real schedule (a test
    holds the two together); 1F1B changes the memory, not the bubble. ZB-H1, with F = B = W
    (one unit each; a micro-batch's work is 3 on every stage): the step lasts
    max(3m + p - 1, 2m + 2p - 1) units. From m = p on that is 3m of work and Qi et al.'s
    (p-1)(F+B-W) = p - 1 of idle time per rank; with fewer micro-batches than stages, too
    few W's are left to fill the fill and drain, and the step lasts 2m + 2p - 1, as the
    event-driven simulator (:func:`parlab.pipeline.timeline`) counts it (a test holds the
    two together).

    ZBV and DualPipeV (a V: two chunks per rank, each F, B and W one unit, 6 per micro-batch
    on every rank; DualPipeV's F&B pairs run as their two passes, as the simulator does by
    default): the step lasts max(6m + p - 1, 4m + 4p - 2) units. Filled (m >= (3p - 1) / 2,
    always so for DualPipeV, which needs m >= 2p), a rank idles p - 1 units out of 6m + p - 1:
    about half of ZB-H1's share, its chunks being half a stage; with fewer micro-batches ZBV's
    warm-up and cool-down set the step, 4m + 4p - 2. DualPipeV with m < 2p is a ValueError.
    """
    if schedule not in memory.ESTIMATED_SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of "
                         f"{list(memory.ESTIMATED_SCHEDULES)}")
    check_count("pp", pp)
    check_count("microbatches", microbatches)
    m, p = microbatches, pp
    problem = memory.interleave_problem(schedule, p, m, virtual_stages, None)
    if problem:
        raise ValueError(problem)
    if virtual_stages > 1:
        v = virtual_stages
        return 1 - m * v / (v * max(m, p) + min(m, p) - 1)
    if schedule == "zb-h1":
        return 1 - 3 * m / max(3 * m + p - 1, 2 * m + 2 * p - 1)
    if schedule in memory.V_SCHEDULES:
        problem = memory.v_problem(schedule, p, m, 2 * p)  # the layers are not known here
        if problem:
            raise ValueError(problem)
        return 1 - 6 * m / max(6 * m + p - 1, 4 * m + 4 * p - 2)
    return (p - 1) / (m + p - 1)
