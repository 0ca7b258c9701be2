"""Korthikanti et al.'s activation formula beside our count of one block, and a measured block."""
from fractions import Fraction

import pytest

from parlab import memory
from parlab.models import GPT2_SMALL, GPT3_175B, TINY

SMALL = TINY.replace(name="small", d_model=64, n_layers=1, n_heads=4, d_ff=256, vocab=256,
                     context=64)
MASKS = ("attention: softmax dropout mask", "attention: dropout mask", "MLP: dropout mask")
DROPOUT_OUTPUT = "attention: dropout output for V"


@pytest.mark.parametrize("config, b, s", [(GPT3_175B, 1, 2048), (GPT2_SMALL, 4, 1024),
                                          (GPT2_SMALL, 3, 100)])
def test_terms_add_up_to_the_papers_formula(config, b, s):
    h, a = config.d_model, config.n_heads
    terms = memory.korthikanti_terms(config, b, s)
    # section 4.1: s b h (34 + 5 a s / h) bytes per layer, 16-bit activations, 1-byte masks
    assert sum(terms.values()) == s * b * h * (34 + Fraction(5 * a * s, h))
    blocks = {p: sum(v for k, v in terms.items() if k.startswith(p))
              for p in ("attention", "MLP", "LayerNorm")}
    assert blocks == {"attention": 11 * s * b * h + 5 * a * s * s * b, "MLP": 19 * s * b * h,
                      "LayerNorm": 4 * s * b * h}


@pytest.mark.parametrize("config, b, s", [(GPT3_175B, 1, 2048), (GPT2_SMALL, 4, 1024)])
def test_without_dropout_only_the_masks_and_the_dropout_output_go(config, b, s):
    h, a = config.d_model, config.n_heads
    with_ = memory.korthikanti_terms(config, b, s)
    without = memory.korthikanti_terms(config, b, s, dropout=False)
    assert with_.keys() == without.keys()
    gone = {k: with_[k] - without[k] for k in with_ if with_[k] != without[k]}
    assert gone == {"attention: softmax dropout mask": a * s * s * b,   # 1 byte each
                    DROPOUT_OUTPUT: 2 * a * s * s * b,                  # 2 bytes each
                    "attention: dropout mask": s * b * h, "MLP: dropout mask": s * b * h}
    assert all(without[k] == 0 for k in (*MASKS, DROPOUT_OUTPUT))
    assert sum(without.values()) == 32 * s * b * h + 2 * a * s * s * b


def test_element_bytes_scale_everything_but_the_masks():
    two, four = (memory.korthikanti_terms(GPT2_SMALL, 2, 512, e) for e in (2, 4))
    assert all(four[k] == (two[k] if k in MASKS else 2 * two[k]) for k in two)


@pytest.mark.parametrize("config, b, s", [(GPT3_175B, 1, 2048), (SMALL, 2, 32)])
def test_the_table_holds_both_counts_whole(config, b, s):
    table = memory.compare_block(config, b, s, "bf16")
    assert list(table.columns) == ["Korthikanti", "ours", "why they differ"]
    assert table["Korthikanti"].sum() == sum(memory.korthikanti_terms(config, b, s).values())
    # every tensor our block saves sits in exactly one row
    assert table["ours"].sum() == memory.activations_per_layer(config, b, s, "bf16")["block 1"]
    assert table["ours"].sum() == sum(memory.block_activations(config, b, s, "bf16").values())
    same = table[table["why they differ"].str.startswith("same")]
    assert len(same) == 9 and (same["Korthikanti"] == same["ours"]).all()
    assert (table.loc[list(MASKS) + [DROPOUT_OUTPUT], "ours"] == 0).all()


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_ours_is_what_a_real_block_saves(precision):
    """One block measured: a 2-block GPT's saved bytes minus a 1-block GPT's (same embedding
    and head), each from a real training step (``memory.measure``)."""
    b, s = 2, 32
    one, two = (memory.measure(SMALL.replace(n_layers=n), (b, s), "sgd", precision).activations
                for n in (1, 2))
    measured = two - one
    table = memory.compare_block(SMALL, b, s, precision)
    ours, theirs = table["ours"].sum(), table["Korthikanti"].sum()
    print(f"{precision}: measured {measured}, ours {ours}, Korthikanti {theirs}")
    assert ours == pytest.approx(measured, rel=0.01)
    assert abs(theirs - measured) > 0.1 * measured  # the paper counts a model with dropout


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="batch"):
        memory.korthikanti_terms(GPT3_175B, 0, 2048)
    with pytest.raises(TypeError, match="dropout"):
        memory.korthikanti_terms(GPT3_175B, 1, 2048, dropout="no")
    with pytest.raises(TypeError, match="TransformerConfig"):
        memory.korthikanti_terms(42, 1, 2048)
    with pytest.raises(ValueError, match="precision"):
        memory.compare_block(GPT3_175B, 1, 2048, "fp8")
    assert memory.korthikanti_terms("GPT-3 175B", 1, 8) == memory.korthikanti_terms(GPT3_175B, 1, 8)
