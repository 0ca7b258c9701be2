"""What a GPU holds while it trains, and what a run costs: estimate, measure, energy.

``calculator`` (parameters, gradients, optimizer state, master weights and activations per GPU,
for any precision, optimizer and data / tensor / pipeline split; the smallest GPU count that
fits), ``measurement`` (a real training step, counted part by part, to check the estimate),
``energy`` (power, the electricity bill, and what a failure costs with and without
checkpoints). Imports :mod:`parlab.models`.
"""

from parlab.memory.calculator import (
    ESTIMATED_SCHEDULES, OPTIMIZERS, PRECISIONS, activation_bytes, activations_per_layer,
    Breakdown, estimate, min_gpus, Plan
)
from parlab.memory.measurement import measure
from parlab.memory.energy import (
    expected_waste, failure_cost, RunCost, training_cost, Waste, young_interval
)

__all__ = ["PRECISIONS", "OPTIMIZERS", "ESTIMATED_SCHEDULES", "Breakdown", "Plan", "estimate",
           "min_gpus", "activation_bytes", "activations_per_layer", "measure", "RunCost", "Waste",
           "training_cost", "failure_cost", "expected_waste", "young_interval"]
