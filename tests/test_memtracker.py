"""PyTorch's own memory tracker as an independent check of ``memory.measure``'s categories.

``torch.distributed._tools.mem_tracker.MemTracker`` attributes every live CPU allocation to
parameters, gradients, optimizer state or activations from outside our code. After a warm-up
step (so Adam's state exists), one step is tracked: the activations alive at the end of the
forward pass, then the model states after the update. ``measure`` must agree with both.
"""

import pytest
import torch
from torch import nn

from parlab import memory

MemTracker = pytest.importorskip("torch.distributed._tools.mem_tracker").MemTracker


def _tracked_step(model, x, optimizer):
    """(activation bytes at the end of forward, {kind: bytes} after the update), per MemTracker."""
    kinds = {}
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        loss = model(x).square().mean()          # the loss measure uses for a plain module
        after_forward = tracker.get_tracker_snapshot("current")
        loss.backward()
        optimizer.step()
        after_step = tracker.get_tracker_snapshot("current")
    for snapshot, names in ((after_forward, ("Activation",)),
                            (after_step, ("Parameter", "Gradient", "Optstate"))):
        for kind, nbytes in snapshot[torch.device("cpu")].items():
            if getattr(kind, "value", kind) in names:
                kinds[kind.value] = nbytes
    return kinds


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_measure_agrees_with_pytorchs_memtracker(optimizer):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 10))
    x = torch.randn(32, 64)
    opt = (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)(model.parameters(),
                                                                         lr=1e-3)
    model(x).square().mean().backward()           # warm-up: gradients and state exist
    opt.step()
    theirs = _tracked_step(model, x, opt)
    ours = memory.measure(model, (32, 64), optimizer, "fp32").parts()
    assert ours["parameters"] == theirs["Parameter"]
    assert ours["gradients"] == theirs["Gradient"]
    assert ours["optimizer_state"] == theirs.get("Optstate", 0)
    # MemTracker also sees the 4-byte loss, which autograd does not save for backward
    assert ours["activations"] == pytest.approx(theirs["Activation"], abs=8)
