"""A small CNN, measured: where its compute and its parameters live, and what each
parallelism strategy would send per layer.

The slides' rule of thumb: convolution layers do about 90-95 % of a CNN's arithmetic with
about 5 % of its parameters, and fully connected layers the reverse. Data parallelism
ships *weights* (gradients) every step, tensor parallelism ships *activations*. So the
cheap choice is data parallel for convolutions (few weights, huge activations) and tensor
parallel for the fully connected layers (many weights, small activations). This module
measures all of it from a real model instead of quoting it: FLOPs by
``torch.utils.flop_counter.FlopCounterMode`` over a real forward and backward pass,
parameters by counting, activation sizes by forward hooks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["SmallCNN", "LayerProfile", "profile", "share_by_kind", "communication_per_layer"]


class SmallCNN(nn.Module):
    """Five 3x3 convolutions (two poolings between them) and two fully connected layers.

    For 3x32x32 images: about 0.56 M convolution weights against 8.4 M fully connected
    ones, while the convolutions do over 90 % of the arithmetic.
    """

    def __init__(self, classes: int = 10, width: int = 64, hidden: int = 2048):
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(3, w, 3, padding=1)
        self.conv2 = nn.Conv2d(w, w, 3, padding=1)
        self.conv3 = nn.Conv2d(w, 2 * w, 3, padding=1)
        self.conv4 = nn.Conv2d(2 * w, 2 * w, 3, padding=1)
        self.conv5 = nn.Conv2d(2 * w, 4 * w, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(4 * w * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The convolutional part: images (B, 3, 32, 32) -> flat features (B, 16 * 4w)."""
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        x = self.pool(x)
        x = torch.relu(self.conv4(torch.relu(self.conv3(x))))
        x = self.pool(x)
        x = self.pool(torch.relu(self.conv5(x)))
        return x.flatten(1)

    def classifier(self, features: torch.Tensor) -> torch.Tensor:
        """The fully connected part: features -> class scores."""
        return self.fc2(torch.relu(self.fc1(features)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@dataclass(frozen=True)
class LayerProfile:
    """One layer, measured: its kind, parameters, FLOPs (forward + backward) and tensor sizes.

    ``input_elems`` and ``output_elems`` are per sample (C x H x W, or features). For a
    convolution, ``kernel_size`` is its (height, width) and ``input_hw`` the (H, W) of the
    images it sees; both are None for a fully connected layer.
    """

    name: str
    kind: str  # "conv" or "fc"
    params: int
    flops: int
    input_elems: int
    output_elems: int
    kernel_size: tuple[int, int] | None = None
    input_hw: tuple[int, int] | None = None


def profile(model: nn.Module, input_shape: tuple[int, ...], batch: int = 8) -> list[LayerProfile]:
    """Measure every Conv2d and Linear layer of ``model`` on a real training step."""
    from torch.utils.flop_counter import FlopCounterMode

    if batch < 1:
        raise ValueError(f"batch must be a positive number of samples, got {batch}")
    layers = {name: m for name, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}
    if not layers:
        raise ValueError("the model has no Conv2d or Linear layer to profile")
    shapes: dict[str, tuple] = {}  # name -> shapes of one sample's input and output
    hooks = [m.register_forward_hook(
        lambda m, inputs, out, name=name: shapes.__setitem__(
            name, (tuple(inputs[0].shape[1:]), tuple(out.shape[1:]))))
        for name, m in layers.items()]
    x = torch.randn(batch, *input_shape, generator=torch.Generator().manual_seed(0))
    try:
        with FlopCounterMode(display=False) as counter:
            model(x).sum().backward()
    finally:
        for hook in hooks:
            hook.remove()
        model.zero_grad(set_to_none=True)
    counts = counter.get_flop_counts()
    prefix = type(model).__name__
    profiles = []
    for name, module in layers.items():
        flops = sum(counts.get(f"{prefix}.{name}", {}).values())
        params = sum(p.numel() for p in module.parameters())
        seen, made = shapes[name]
        conv = isinstance(module, nn.Conv2d)
        profiles.append(LayerProfile(name, "conv" if conv else "fc", params, int(flops),
                                     math.prod(seen), math.prod(made),
                                     tuple(module.kernel_size) if conv else None,
                                     seen[-2:] if conv else None))
    return profiles


def share_by_kind(profiles: list[LayerProfile]) -> dict[str, dict[str, float]]:
    """Fraction of all parameters and of all FLOPs held by each layer kind."""
    total_params = sum(p.params for p in profiles)
    total_flops = sum(p.flops for p in profiles)
    shares = {}
    for kind in sorted({p.kind for p in profiles}):
        mine = [p for p in profiles if p.kind == kind]
        shares[kind] = {"params": sum(p.params for p in mine) / total_params,
                        "flops": sum(p.flops for p in mine) / total_flops}
    return shares


def communication_per_layer(profiles: list[LayerProfile], batch: int, dtype_bytes: int = 4
                            ) -> list[dict]:
    """Bytes one training step must move for each layer under each strategy (the slides).

    - data parallel: the layer's gradient, as many elements as it has weights
      (C_in x C_out for a fully connected layer), whatever the batch;
    - tensor parallel, partition output: the layer's output activations, B x C_out
      (x H x W for a convolution);
    - tensor parallel, reduce output: the layer's input activations, B x C_in (x H x W).

    These are the slides' element counts times the element size; how many times a
    collective sends them (for example 2(N-1)/N for a ring all-reduce) comes on top
    and is the same factor for all three.
    """
    rows = []
    for p in profiles:
        rows.append({
            "layer": p.name, "kind": p.kind,
            "data_parallel": p.params * dtype_bytes,
            "tp_partition_output": batch * p.output_elems * dtype_bytes,
            "tp_reduce_output": batch * p.input_elems * dtype_bytes,
        })
    for row in rows:
        row["cheapest"] = min(("data_parallel", "tp_partition_output", "tp_reduce_output"),
                              key=row.__getitem__)
    return rows
