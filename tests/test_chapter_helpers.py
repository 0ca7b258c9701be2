"""Small public helpers that chapters 05 and 06 quote in their prose, checked by hand.

Each value is worked out here from the model's definition or a formula, not read back from
the function under test.
"""
import pytest
import torch
from torch import nn

from parlab import sharded
from parlab.hybrid import evaluate
from parlab.models import SmallCNN, profile


# --- parlab.models.profile: kernel and image size of each convolution -------------------------

def test_profile_reports_each_convolutions_kernel_and_input_image():
    found = {p.name: (p.kernel_size, p.input_hw) for p in profile(SmallCNN(), (3, 32, 32))}
    # SmallCNN: 3x3 kernels, padding 1 (size kept), a 2x2 pooling after conv2 and conv4
    assert found == {"conv1": ((3, 3), (32, 32)), "conv2": ((3, 3), (32, 32)),
                     "conv3": ((3, 3), (16, 16)), "conv4": ((3, 3), (16, 16)),
                     "conv5": ((3, 3), (8, 8)), "fc1": (None, None), "fc2": (None, None)}


def test_profile_reads_a_rectangular_kernel_and_image():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, (3, 5)), nn.Flatten(), nn.Linear(2 * 8 * 8, 3))
    conv, fc = profile(model, (1, 10, 12), batch=2)
    assert (conv.kernel_size, conv.input_hw) == ((3, 5), (10, 12))
    assert (conv.input_elems, conv.output_elems) == (1 * 10 * 12, 2 * 8 * 8)  # 10-3+1, 12-5+1
    assert (fc.kernel_size, fc.input_hw, fc.input_elems) == (None, None, 128)


# --- parlab.hybrid.Layout: parameters per stage and per GPU ------------------------------------

def _gpt3_parameters():
    """GPT-3 175B by hand: 96 blocks of 12 d^2 + 13 d (four d x d projections with biases, a
    d -> 4d -> d feed-forward layer with biases, two LayerNorms), token and position
    embeddings, a final LayerNorm; the head is tied to the token embedding."""
    d, layers, vocab, context = 12288, 96, 50257, 2048
    return layers * (12 * d * d + 13 * d) + vocab * d + context * d + 2 * d


def test_layout_shares_the_parameters_over_stages_and_gpus():
    layout = evaluate("GPT-3 175B", dp=8, tp=8, pp=16, microbatches=192)
    total = _gpt3_parameters()
    assert layout.parameters_per_stage == pytest.approx(total / 16)
    assert layout.parameters_per_gpu == pytest.approx(total / 128)
    assert f"{layout.parameters_per_gpu / 1e9:.1f}" == "1.4"      # chapter 05's "about 1.4"


# --- parlab.sharded: the scaling section's batch and traffic ratio ------------------------------

def test_the_global_batch_is_2048_sequences_of_2048_tokens():
    assert sharded.GLOBAL_BATCH == (2048, 2048)
    assert sharded.GLOBAL_TOKENS == 4_194_304


def test_stage_3_sends_half_as_much_again_as_stage_0_at_every_size():
    # stage 0: one all-reduce, 2 (N-1)/N P per rank; stage 3: two all-gathers and one
    # reduce-scatter, 3 (N-1)/N P per rank
    table = sharded.zero_scaling(7.5e9, gpus=(8, 64, 1024))
    sent = table.pivot(index="gpus", columns="stage", values="GB sent per GPU")
    assert list(sent[3] / sent[0]) == pytest.approx([1.5, 1.5, 1.5])
    assert sent.loc[8, 0] == pytest.approx(2 * 7 / 8 * 7.5e9 * 2 / 1e9)   # bf16: 2 B each
