"""Activation memory against Korthikanti et al. (2022), "Reducing Activation Recomputation in
Large Transformer Models" (arXiv:2205.05198): Table 2's per-layer formulas, equation 5 (x the
interleaving factor of section 4.2.3) with section 4.3's terms for the first pipeline stage,
and section 6.1's words for Figure 7, on the four models of Table 3.

One tolerance for every row (issue 31): our estimate within 10 % of the paper's bytes. A row
that misses would be an expected failure (strict) with its reason; none misses today, once
the published model is counted with its dropout (our GPT has none).
"""

import pytest

from parlab import memory
from parlab.hybrid import KORTHIKANTI_2022
from parlab.hybrid.published_korthikanti_memory import (
    compare_memory, FIGURE_7_READING_ERROR, FIGURE_7_TEXT, figure_7_percent, memory_comparisons,
    paper_first_stage, paper_layer_bytes, KORTHIKANTI_TECHNIQUES
)
from parlab.models import GPT3_175B

MEMORY_TOLERANCE = 0.10
MISSES: dict[tuple[str, str], str] = {}       # (model, technique) -> why; none today


def _params():
    return [pytest.param(run, method, id=f"{run.name}-{method}",
                         marks=[pytest.mark.xfail(strict=True, reason=MISSES[run.name, method])]
                         if (run.name, method) in MISSES else [])
            for run in KORTHIKANTI_2022 for method in KORTHIKANTI_TECHNIQUES]


def test_table_2_by_hand_for_the_22b_model():
    """Table 3's 22B row: s 2048, b 4, h 6144, a 64, t 8, so s b h = 50,331,648 and
    5 a s / (h t) = 655,360 / 49,152 = 40/3. Table 2's coefficients, by hand: none
    34 + 320/3 = 422/3; tp 10 + 3 + 40/3 = 79/3; tp + sp 17/4 + 40/3 = 211/12; tp +
    selective 13; tp + sp + selective 17/4; full 2."""
    run = KORTHIKANTI_2022[0]
    sbh = 2048 * 4 * 6144
    assert sbh == 50_331_648
    expected = {"none": 7_079_985_152, "tp": 1_325_400_064, "tp+sp": 884_998_144,
                "tp+selective": 654_311_424, "tp+sp+selective": 213_909_504,
                "full": 100_663_296}
    assert expected["tp"] * 3 == 79 * sbh and expected["tp+sp"] * 12 == 211 * sbh
    assert expected["none"] * 3 == 422 * sbh and expected["tp+sp+selective"] * 4 == 17 * sbh
    assert {m: paper_layer_bytes(run, m) for m in KORTHIKANTI_TECHNIQUES} == expected
    # first stage, p = 1: 48 layers x 17/4 (equation 6) + the embedding's mask s b h / 8 and
    # 4 s b h / 8 (last LayerNorm, output layer input) + fp32 logits 4 s b v / 8 (section 4.3)
    assert paper_first_stage(run, "tp+sp+selective") == 204 * sbh + sbh // 8 + sbh // 2 \
        + 4 * 2048 * 4 * 51_200 // 8 == 10_508_828_672


def test_first_stage_interleaving_by_hand():
    """175B (Table 3: 96 layers, tp 8, pp 8, three chunks): equation 6 x (1 + 7/24) =
    124 layers of 34/8 s b h, + the embedding's mask s b h x 8 / 8 (s b h = 25,165,824)."""
    run = KORTHIKANTI_2022[1]
    sbh = 2048 * 1 * 12288
    assert paper_first_stage(run, "tp+sp+selective") == 124 * 34 * sbh / 8 + sbh


@pytest.mark.parametrize("run, method", _params())
def test_memory_within_tolerance(run, method):
    c = compare_memory(run, method)
    assert abs(c.layer_error) <= MEMORY_TOLERANCE, (
        f"{run.source} ({method}), per layer: ours {c.ours_layer:,}, paper "
        f"{c.paper_layer:,.0f} ({c.layer_error:+.1%})")
    assert abs(c.first_stage_error) <= MEMORY_TOLERANCE, (
        f"{run.source} ({method}), first stage: ours {c.ours_first:,}, paper "
        f"{c.paper_first:,.0f} ({c.first_stage_error:+.1%})")


def test_dropout_is_what_closes_the_gap():
    """Our GPT as built (no dropout) misses every technique that keeps the attention core
    by more than the tolerance (its core keeps 2 a s^2 b bytes, the paper's 5); with
    Megatron's dropout counted, the same count is within it. Full recompute keeps only the
    layer's input either way."""
    for c in memory_comparisons():
        assert abs(c.layer_error) <= MEMORY_TOLERANCE
        if c.method in ("none", "tp", "tp+sp", "tp+selective"):
            assert c.layer_error_no_dropout < -MEMORY_TOLERANCE
        if c.method == "full":
            assert c.ours_layer == c.ours_layer_no_dropout == c.paper_layer


def test_what_dropout_adds_by_hand():
    """175B block, b 1, s 2048, tp 8: the softmax dropout's 1-byte mask and 2-byte output,
    96 x 2048^2 / 8 x 3 bytes; the two 1-byte masks after attention and MLP, 2 s b h (split
    8 ways under sequence parallelism)."""
    s, h, a = 2048, 12288, 96
    for sp, masks in ((False, 2 * s * h), (True, 2 * s * h // 8)):
        with_, without = (sum(memory.block_activations(GPT3_175B, 1, s, "bf16", 8, sp,
                                                       dropout=d).values())
                          for d in (True, False))
        assert with_ - without == 3 * a * s * s // 8 + masks


def test_estimate_prices_dropout_only_where_modelled():
    with pytest.raises(TypeError, match="dropout"):
        memory.estimate(GPT3_175B, (1, 2048), precision="bf16", dropout="yes")
    with pytest.raises(ValueError, match="dropout"):
        memory.estimate("Llama-2-7B", (1, 2048), precision="bf16", dropout=True)
    with pytest.raises(ValueError, match="dropout"):
        memory.estimate(GPT3_175B, (1, 2048), precision="bf16", cp=2, dropout=True)
    plain = memory.estimate(GPT3_175B, (1, 2048), precision="bf16", tp=8)
    assert memory.estimate(GPT3_175B, (1, 2048), precision="bf16", tp=8,
                           dropout=False) == plain


@pytest.mark.parametrize("run", KORTHIKANTI_2022, ids=lambda r: r.name)
def test_figure_7_text(run):
    """Section 6.1's words for Figure 7, within the reading error (percentage points):
    together the techniques keep under 20 % of the baseline, full recompute 10 %; and ours
    keeps each technique's share of the baseline within 10 % of Table 2's."""
    for method in KORTHIKANTI_TECHNIQUES:
        paper, ours = figure_7_percent(run, method)
        assert ours == pytest.approx(paper, rel=MEMORY_TOLERANCE)
    assert figure_7_percent(run, "tp+sp+selective")[1] <= \
        FIGURE_7_TEXT["tp+sp+selective"] + FIGURE_7_READING_ERROR
    assert figure_7_percent(run, "full")[1] == pytest.approx(FIGURE_7_TEXT["full"],
                                                             abs=FIGURE_7_READING_ERROR)


def test_chapter_table():
    from parlab.experiments.ch05_published import korthikanti_memory_table
    text = korthikanti_memory_table()
    lines = text.splitlines()
    assert len(lines) == 1 + len(KORTHIKANTI_TECHNIQUES)
    assert lines[0].split()[:2] == ["technique", "22B"]
    assert lines[-1].startswith("full") and "(miss)" not in text
