"""The slides' summary of the strategies (pros and cons), each line backed by a computed number.

Why this module exists: a table of pros and cons is easy to recite and hard to check. Each row
here carries the numbers that make its claims true, computed by the package the chapters
built (memory calculator, pipeline simulator, traffic cost model, CNN profile), so a change in
any of them shows up in the summary too.
"""

from __future__ import annotations

from dataclasses import dataclass

from parlab.hardware import GPU_MEMORY_GB, NIC_GBPS
from parlab.units import GB, format_bytes

__all__ = ["SummaryRow", "summary_table", "summary_text", "ddp_buckets", "SLIDES_DATA_CLAIM"]


@dataclass(frozen=True)
class SummaryRow:
    """One strategy: what it is good at, what it costs, and the numbers behind both."""

    strategy: str
    pros: str
    cons: str
    evidence: str
    numbers: dict


#: the slides' first claim for data parallelism, word for word (summary slides 41 and 42)
SLIDES_DATA_CLAIM = "Require no communication during forward/backward"


def ddp_buckets(config, precision: str = "bf16") -> list[int]:
    """Bytes of each gradient bucket DistributedDataParallel would all-reduce for ``config``.

    The model is built on the meta device (shapes, no memory) in ``precision``, and its
    parameters packed by DDP's default rule (:func:`parlab.data_parallel.bucket_bytes` with
    a 25 MiB cap and a first bucket of 1 MiB), the rule chapter 02 checks against DDP itself.
    """
    import torch
    from parlab.data_parallel import bucket_bytes, DDP_BUCKET_CAP_BYTES, DDP_FIRST_BUCKET_BYTES
    from parlab.memory import PRECISIONS
    from parlab.models import GPT, Llama, LlamaConfig

    with torch.device("meta"):
        model = (Llama if isinstance(config, LlamaConfig) else GPT)(config)
    model = model.to(PRECISIONS[precision].dtype)
    return bucket_bytes(list(model.parameters()), DDP_BUCKET_CAP_BYTES, DDP_FIRST_BUCKET_BYTES)


def _data_row(config, gpus, capacity_gb) -> SummaryRow:
    from parlab.models import SmallCNN, communication_per_layer, profile
    from parlab.memory import estimate
    from parlab.comm import allreduce_bytes_per_rank

    ring = allreduce_bytes_per_rank(1.0, gpus)[0]
    profiles = profile(SmallCNN(), (3, 32, 32), batch=1)
    sent = [sum(r["data_parallel"] for r in communication_per_layer(profiles, b))
            for b in (1, 64)]
    whole = estimate(config, (1, config.context), "adam", "bf16").total
    ratio = sent[1] / sent[0]
    buckets = ddp_buckets(config)
    numbers = {"ring_bytes_per_gradient_byte": ring, "cnn_traffic_ratio_batch_64_vs_1": ratio,
               "whole_model_bytes_per_gpu": whole,
               "times_gpu_memory": whole / (capacity_gb * GB), "ddp_buckets": len(buckets),
               "ddp_bucket_bytes": sum(buckets)}
    evidence = (f"DDP packs {config.name}'s bf16 gradients into {len(buckets):,} buckets "
                f"({format_bytes(sum(buckets))} in all) and all-reduces each one during the "
                f"backward pass, as soon as its gradients are ready (chapter 02); "
                f"a ring all-reduce sends {ring:.3f} x the gradients per GPU at N={gpus:,}; "
                f"the CNN's gradient traffic at batch 64 over batch 1: {ratio:.2f}; "
                f"{config.name} with Adam in bf16 needs {format_bytes(whole)} on every GPU, "
                f"{numbers['times_gpu_memory']:.0f} times the {capacity_gb:g} GB of one GPU")
    return SummaryRow("data", f"scales out: each GPU takes its own share of the batch. The "
                      f"slides: \"{SLIDES_DATA_CLAIM}\". That holds for the forward pass; the "
                      f"backward pass all-reduces the gradients, bucket by bucket while it "
                      f"runs, and that traffic depends on the model, not on the batch",
                      "every GPU holds the whole model and its optimizer state, so a model "
                      "larger than one GPU cannot train this way", evidence, numbers)


def _model_row(config, capacity_gb) -> SummaryRow:
    from parlab.memory import estimate
    from parlab.pipeline import schedule, simulate

    per_gpu = estimate(config, (1, config.context), "adam", "bf16", pp=config.n_layers).total
    idle = simulate(schedule("naive", 4, 4)).bubble_fraction
    numbers = {"bytes_per_gpu_one_layer_each": per_gpu, "naive_bubble_p4": idle}
    verdict = "fits" if per_gpu <= capacity_gb * GB else "does not fit"
    evidence = (f"{config.name} on {config.n_layers} GPUs, one block each: "
                f"{format_bytes(per_gpu)} per GPU ({verdict} in {capacity_gb:g} GB); naive "
                f"schedule on 4 GPUs: {idle:.0%} of the GPU time idle")
    return SummaryRow("model", "trains models larger than one GPU: each GPU stores only its "
                      "own layers, which suits models with many parameters",
                      "one GPU works while the others wait for its output; it does not scale "
                      "to many GPUs by itself", evidence, numbers)


def _pipeline_row(config) -> SummaryRow:
    from parlab.memory import PRECISIONS
    from parlab.pipeline import schedule, simulate

    bubble = {m: simulate(schedule("1f1b", 4, m)).bubble_fraction for m in (4, 32)}
    activation = config.context * config.d_model * PRECISIONS["bf16"].bytes
    numbers = {"bubble_p4_m4": bubble[4], "bubble_p4_m32": bubble[32],
               "activation_bytes_per_send": activation}
    evidence = (f"4 stages: bubble {bubble[4]:.3f} with 4 micro-batches, {bubble[32]:.3f} with "
                f"32 (simulated 1F1B); each micro-batch of one {config.context}-token sequence "
                f"sends {format_bytes(activation)} across every stage boundary, twice")
    return SummaryRow("pipeline", "micro-batches keep all stages busy at once; works well for "
                      "deep models and large batches",
                      "idle bubbles at the start and end of every step; activations and their "
                      "gradients travel between stages; in-flight micro-batches use memory",
                      evidence, numbers)


def _tensor_row(config) -> SummaryRow:
    from parlab.memory import PRECISIONS
    from parlab.comm import NVLINK, nic
    from parlab.tensor_parallel import parameter_memory
    from parlab.comm import allreduce_time

    rows = {r["tp"]: r["parameters"] for r in parameter_memory(config, (1, 8), "bf16")}
    activation = config.context * config.d_model * PRECISIONS["bf16"].bytes
    fast, slow = (allreduce_time(activation, 8, "ring", link) for link in (NVLINK, nic(NIC_GBPS)))
    numbers = {"parameters_per_gpu_tp1": rows[1], "parameters_per_gpu_tp8": rows[8],
               "block_allreduce_s_nvlink": 4 * fast, "block_allreduce_s_nic": 4 * slow}
    evidence = (f"{config.name}'s parameters per GPU: {rows[1] / 1e9:.1f} B at tp=1, "
                f"{rows[8] / 1e9:.1f} B at tp=8; the 4 all-reduces of one block and one "
                f"sequence take {4e3 * fast:.2f} ms over NVLink, {4e3 * slow:.2f} ms over "
                f"{NIC_GBPS} Gb/s NICs ({slow / fast:.1f} x)")
    return SummaryRow("tensor", "splits the matrices of every layer, so memory and work per "
                      "GPU shrink together; suits layers with many parameters",
                      "every block all-reduces its activations forward and backward, "
                      "traffic that grows with the batch and needs a fast link (one server)",
                      evidence, numbers)


def summary_table(config="GPT-3 175B", gpus: int = 1024,
                  gpu_memory_gb: float = GPU_MEMORY_GB) -> list[SummaryRow]:
    """The rows for data, model, pipeline and tensor parallelism, for ``config``."""
    from parlab.models import get_config
    config = get_config(config)
    return [_data_row(config, gpus, gpu_memory_gb), _model_row(config, gpu_memory_gb),
            _pipeline_row(config), _tensor_row(config)]


def summary_text(rows: list[SummaryRow]) -> str:
    """The rows as text: strategy, + pros, - cons, = the numbers."""
    blocks = [f"{r.strategy} parallelism\n  + {r.pros}\n  - {r.cons}\n  = {r.evidence}"
              for r in rows]
    return "\n\n".join(blocks)
