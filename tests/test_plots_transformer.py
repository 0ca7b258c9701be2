"""Figures 8-15 and 8-16 are drawn from real objects, not typed-in numbers."""
import torch

from parlab.models import GPT3_175B, count_parameters
from parlab.experiments import qkv_example
from parlab.viz.plots import transformer_figure


def test_figure_8_16_shows_what_the_model_computes():
    m = qkv_example(tokens=(3, 7, 1, 5))
    assert m["X"].shape == (4, 8)
    for name in "QKV":
        assert m[f"W_{name}"].shape == (8, 8)
        torch.testing.assert_close(m[name], m["X"] @ m[f"W_{name}"] + (m[name] - m["X"] @ m[f"W_{name}"])[0])
    assert not torch.equal(m["Q"], m["K"])  # three different projections


def test_figure_8_15_is_labelled_from_the_config():
    fig = transformer_figure(GPT3_175B, count_parameters(GPT3_175B))
    title = fig.axes[0].get_title()
    assert f"{count_parameters(GPT3_175B)['total']:,}" in title
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "x 96 blocks" in texts and "96 heads of 128" in texts
