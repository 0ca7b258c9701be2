"""Korthikanti et al. (2022): activation memory, the paper's formulas beside our estimate.

Why this module exists: the paper measured its iteration times in a table
(:mod:`parlab.hybrid.published_korthikanti`), but its memory only in formulas and in a
figure of percentages. This module puts, for each model of its Table 3 and each technique of
its Table 2, the paper's formula in bytes beside :func:`parlab.memory.estimate` of the same
layout, so the estimate is checked against the paper's own accounting.

**Korthikanti et al. (2022)**, "Reducing Activation Recomputation in Large Transformer
Models" (arXiv:2205.05198). For s = sequence, b = micro-batch, h = hidden size, a = heads,
t = tensor-parallel size, L = layers, p = pipeline stages, m = chunks per rank (interleaving),
v = vocabulary; 2-byte activations, 1-byte dropout masks; bytes:

- **Table 2**, per transformer layer (:data:`KORTHIKANTI_TECHNIQUES`): no parallelism
  s b h (34 + 5 a s/h) (equation 1); tensor parallel (the baseline)
  s b h (10 + 24/t + 5 a s/(h t)) (equation 2); tensor + sequence parallel
  s b h (34/t + 5 a s/(h t)) (equation 4); tensor parallel + selective recompute
  s b h (10 + 24/t); tensor + sequence parallel + selective recompute s b h 34/t (equation 6
  per layer); full recompute s b h 2 (section 5: 2 s b h L).
- **Section 4.2.3**, the first pipeline stage holds p micro-batches of L/p layers: L layers'
  worth (equation 5), times 1 + (p - 1)/(p m) with the interleaved schedule.
- **Section 4.3**, outside the layers, on the first stage: the embedding's dropout mask,
  s b h p / t, and only when p = 1 the last LayerNorm's and the output layer's inputs and the
  fp32 logits, 4 s b h / t (1 + v/h). The paper calls both negligible and leaves them out of
  equations 5 and 6; :func:`paper_first_stage` adds them. It derives them with sequence
  parallelism, whose split of the tokens gives the mask's and the two inputs' 1/t; for a
  technique without it the same derivation keeps them whole on each rank, s b h p and
  4 s b h + 4 s b v / t (the logits stay split by vocabulary), which is what
  :func:`paper_first_stage` uses there (at p = 64 on the 1T model the embedding's mask
  alone is a fifth of full recompute's kept bytes, so the form matters).

**What each side counts.** Both count what one tensor-parallel rank keeps from a layer's
forward to its backward. The paper's GPT is Megatron-LM's, with dropout; ours has none, so
the comparison prices the published model with ``dropout=True``
(:func:`parlab.memory.block_activations`: the softmax dropout's mask and output, the masks
after the attention and the MLP, and the embedding's mask), for every row alike: without it
the attention core counts 2 a s^2 b bytes where the paper counts 5, and the rows miss by up
to half. Ours also counts what the paper leaves out as small: LayerNorm's mean and 1/std
(4 values per token) and the T x T causal mask each layer keeps (T^2 bytes, dropped with
the core under selective recompute); at the ends the token ids and positions, the final
LayerNorm's input and output (not split by sequence parallelism) and bf16 log-probabilities
(the paper: fp32 logits). No flash attention: the paper's runs kept the softmax output.
Recompute: the paper counts what is kept; ours (:func:`parlab.memory.estimate`) also holds
the one layer being recomputed during its backward (``rebuilt``), which the paper leaves
out: :attr:`MemoryComparison.first_stage_error` compares the kept bytes alone, and
``rebuilt`` is reported beside them.

**Figure 7** draws each technique's activation memory as a percentage of the tensor-parallel
baseline (equation 2), per model, as bars without printed values. Only section 6.1's text
gives numbers (:data:`FIGURE_7_TEXT`): each technique alone "nearly in half", both together
"a 5x reduction bringing the memory requirements to under 20%", full recompute "at 10% of the
baseline". They are rounded words, not readings of the bars: the reading error is taken as
:data:`FIGURE_7_READING_ERROR` percentage points either side (the Table 2 formulas
themselves put full recompute between 7.6 % and 9.5 % of the baseline on these models).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from parlab.checks import check_choice
from parlab.hybrid.published import SEQ, VOCAB
from parlab.hybrid.published_korthikanti import KORTHIKANTI_2022, KorthikantiRun
from parlab.memory import block_activations, estimate, layer_activations

__all__ = ["KORTHIKANTI_TECHNIQUES", "FIGURE_7_TEXT", "FIGURE_7_READING_ERROR",
           "MemoryComparison", "paper_layer_bytes", "paper_first_stage", "compare_memory",
           "memory_comparisons", "figure_7_percent"]

#: Table 2's rows: name -> (tensor-parallel ranks used: "t" the row's or 1, sequence
#: parallel, recompute). "none" is Table 2's "no parallelism" (t = 1).
KORTHIKANTI_TECHNIQUES = {
    "none": (1, False, None),
    "tp": ("t", False, None),
    "tp+sp": ("t", True, None),
    "tp+selective": ("t", False, "selective"),
    "tp+sp+selective": ("t", True, "selective"),
    "full": ("t", False, "full"),
}

#: Section 6.1's words for Figure 7, as a percentage of the baseline (equation 2): both
#: techniques together "under 20%" (an upper bound), full recompute "at 10%".
FIGURE_7_TEXT = {"tp+sp+selective": 20.0, "full": 10.0}
#: Percentage points either side of :data:`FIGURE_7_TEXT`: the text's rounding (one value for
#: four bars, "under 20%", "10%"), stated before comparing.
FIGURE_7_READING_ERROR = 3.0

_PRECISION = "bf16"          # section 4: 16-bit activations (mixed precision, section 6)


def _layout(run: KorthikantiRun, method: str) -> tuple[int, bool, str | None]:
    check_choice("method", method, tuple(KORTHIKANTI_TECHNIQUES))
    t, sp, recompute = KORTHIKANTI_TECHNIQUES[method]
    return (run.tp if t == "t" else t), sp, recompute


def paper_layer_bytes(run: KorthikantiRun, method: str) -> Fraction:
    """Table 2: bytes one rank keeps for one transformer layer and one micro-batch."""
    t, _, _ = _layout(run, method)
    s, b, h, a = SEQ, run.micro_batch, run.hidden, run.heads
    core = Fraction(5 * a * s, h * t)
    coefficient = {"none": 34 + core, "tp": 10 + Fraction(24, t) + core,
                   "tp+sp": Fraction(34, t) + core, "tp+selective": 10 + Fraction(24, t),
                   "tp+sp+selective": Fraction(34, t), "full": Fraction(2)}[method]
    return s * b * h * coefficient


def paper_first_stage(run: KorthikantiRun, method: str) -> Fraction:
    """Bytes of activations on the first pipeline stage by the paper: Table 2 x L layers
    (equation 5), x (1 + (p - 1)/(p m)) when interleaved (section 4.2.3), + section 4.3's
    embedding dropout s b h p / t and, when p = 1, 4 s b h / t (1 + v/h); without sequence
    parallelism the tokens are not split: s b h p and 4 s b h + 4 s b v / t (module
    docstring)."""
    t, sp, _ = _layout(run, method)
    s, b, h, p, m = SEQ, run.micro_batch, run.hidden, run.pp, run.virtual_stages
    layers = paper_layer_bytes(run, method) * run.layers
    if m > 1:
        layers *= 1 + Fraction(p - 1, p * m)
    split = t if sp else 1                      # sequence parallelism splits the tokens
    extra = Fraction(s * b * h * p, split)
    if p == 1:
        extra += Fraction(4 * s * b * h, split) + Fraction(4 * s * b * VOCAB, t)
    return layers + extra


@dataclass(frozen=True)
class MemoryComparison:
    """One model x one technique: the paper's bytes beside ours (per rank)."""

    run: KorthikantiRun
    method: str
    paper_layer: float           # Table 2, bytes per layer and micro-batch
    ours_layer: int              # what one layer keeps, with Megatron's dropout
    ours_layer_no_dropout: int   # the same for our GPT as built (no dropout)
    paper_first: float           # first stage, equation 5 (x interleaving) + section 4.3
    ours_first: int              # memory.estimate's activations less ``rebuilt``
    rebuilt: int                 # the one layer recomputation rebuilds at a time (ours only)

    @property
    def layer_error(self) -> float:
        """(ours - paper) / paper, per layer: positive = ours counts more."""
        return self.ours_layer / self.paper_layer - 1

    @property
    def layer_error_no_dropout(self) -> float:
        return self.ours_layer_no_dropout / self.paper_layer - 1

    @property
    def first_stage_error(self) -> float:
        """(ours - paper) / paper, kept bytes on the first stage."""
        return self.ours_first / self.paper_first - 1


def compare_memory(run: KorthikantiRun, method: str) -> MemoryComparison:
    """The paper's activation bytes and ours for ``run`` (a Table 3 row) with ``method`` (a
    key of :data:`KORTHIKANTI_TECHNIQUES`), at its published layout (pp, interleaving,
    micro-batch)."""
    tp, sp, recompute = _layout(run, method)
    config, b = run.config, run.micro_batch

    def layer(dropout: bool) -> tuple[int, int]:
        block = sum(block_activations(config, b, SEQ, _PRECISION, tp, sp,
                                      dropout=dropout).values())
        return layer_activations(config, block, b, SEQ, 2, tp, recompute, sp, dropout)

    (kept, rebuilt), (bare, _) = layer(True), layer(False)
    whole = estimate(config, (run.batch, SEQ), "adam", _PRECISION, 1, tp, run.pp,
                     run.microbatches, recompute=recompute, sequence_parallel=sp,
                     gpu=run.gpu, virtual_stages=run.virtual_stages, dropout=True)
    return MemoryComparison(run, method, float(paper_layer_bytes(run, method)), kept, bare,
                            float(paper_first_stage(run, method)),
                            whole.activations - rebuilt, rebuilt)


def memory_comparisons(runs=KORTHIKANTI_2022,
                       methods=tuple(KORTHIKANTI_TECHNIQUES)) -> list[MemoryComparison]:
    """:func:`compare_memory` for every model x technique (Table 3 x Table 2)."""
    return [compare_memory(run, method) for run in runs for method in methods]


def figure_7_percent(run: KorthikantiRun, method: str) -> tuple[float, float]:
    """(paper, ours): ``method``'s activations per layer as a percentage of the
    tensor-parallel baseline's (equation 2), as Figure 7 draws them: the paper's by Table 2,
    ours by the same count as :func:`compare_memory` (kept bytes, with dropout)."""
    mine, base = compare_memory(run, method), compare_memory(run, "tp")
    return (100 * mine.paper_layer / base.paper_layer, 100 * mine.ours_layer / base.ours_layer)
