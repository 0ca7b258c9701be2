"""Chapter 01 exercises: put bytes, GPUs and dollars on Figure 8-1 and the power example.

Every expected answer is computed by the package (``parlab.memory``, ``parlab.models``,
``parlab.memory.energy``) when the checker runs, so it cannot drift from what the notebook shows.
"""

from __future__ import annotations

import math

from parlab.exercises.registry import exercise, right, wrong


def _close(answer, expected, rel=0.01) -> bool:
    return math.isclose(float(answer), expected, rel_tol=rel)


@exercise("01.1", "A model has 1.5 billion parameters and is trained with Adam in fp32. How "
                  "many GB (10**9 bytes) does Adam's optimizer state take?")
def _adam_state(answer):
    from parlab.units import GB
    from parlab.memory import OPTIMIZERS
    n = 1.5e9
    expected = n * 4 * OPTIMIZERS["adam"] / GB
    value = float(answer)
    if _close(value, expected):
        return right("Adam keeps two fp32 values per parameter (the running mean of the "
                     "gradient and of its square): 8 bytes per parameter.")
    if _close(value, expected / 2):
        return wrong("That is one value per parameter. Adam keeps two moving averages.")
    if _close(value, expected * 2) or _close(value, expected * 1.5):
        return wrong("Count only the optimizer's own state, not the weights or the gradients.")
    if _close(value, expected * GB) or _close(value, expected * GB / 4):
        return wrong("Give the answer in GB (10**9 bytes), not bytes or values.")
    return wrong("How many numbers does Adam remember per parameter, and how many bytes is an "
                 "fp32 number?")


@exercise("01.2", "GPT-3 175B is trained in bf16 mixed precision with Adam (bf16 weights and "
                  "gradients, fp32 master weights and Adam state). Ignoring activations, how "
                  "many 80 GB GPUs (1 GB = 10**9 bytes) are needed at least just to hold it?")
def _gpt3_gpus(answer):
    from parlab.units import GB
    from parlab.models import GPT3_175B, count_parameters
    n = count_parameters(GPT3_175B)["total"]
    per_param = 2 + 2 + 4 + 8
    expected = math.ceil(n * per_param / (80 * GB))
    value = float(answer)
    if value == expected:
        return right("16 bytes per parameter (2 + 2 + 4 + 4 + 4) for about 175 billion "
                     "parameters, spread perfectly evenly; real splits need more.")
    if value != int(value) or value < 1:
        return wrong("A number of GPUs is a whole number: round up.")
    if value == math.ceil(n * per_param / (80 * 2**30)):
        return wrong("You used GiB (2**30 bytes); this exercise counts GB as 10**9 bytes.")
    if value == math.ceil(n * 2 / (80 * GB)):
        return wrong("That holds the bf16 weights only. Training also keeps gradients, the "
                     "fp32 master copy and Adam's two moments.")
    if value in (math.ceil(n * 12 / (80 * GB)), math.ceil(n * 14 / (80 * GB))):
        return wrong("Close: list every copy the GPU keeps per parameter, in bf16 and in "
                     "fp32, and add their bytes.")
    if value == math.floor(n * per_param / (80 * GB)):
        return wrong("Round up: a fraction of a GPU still takes a whole GPU.")
    return wrong("Count the bytes per parameter for each copy (weights, gradients, master "
                 "weights, two Adam moments), multiply by the parameter count of GPT-3 175B, "
                 "and divide by 80 GB.")


@exercise("01.3", "A run uses 16,384 GPUs at 700 W each for 54 days, with electricity at "
                  "$0.08 per kWh. What does the electricity cost, in USD?")
def _energy_bill(answer):
    from parlab.memory import training_cost
    expected = training_cost(gpus=16_384, watts_per_gpu=700, days=54, usd_per_kwh=0.08).cost_usd
    value = float(answer)
    if _close(value, expected):
        return right("Power x hours x price: the same three steps as the book's example.")
    if _close(value, expected / 24):
        return wrong("Energy is power x *hours*: convert the days first.")
    if _close(value, expected * 1000) or _close(value, expected / 1000):
        return wrong("Check the units: the price is per kWh, and 1 kW = 1,000 W.")
    return wrong("Compute the power in kW, multiply by the hours of the run to get kWh, then "
                 "by the price per kWh.")


@exercise("01.4", "A job fails on average every 4 hours, and writing a checkpoint takes 6 "
                  "minutes. By Young's rule, every how many hours should it checkpoint?")
def _young(answer):
    from parlab.memory import young_interval
    expected = young_interval(mtbf_hours=4, checkpoint_minutes=6)
    value = float(answer)
    if _close(value, expected, rel=0.03):
        return right("sqrt(2 x checkpoint time x MTBF): checkpoint too often and the writes "
                     "cost time, too rarely and each failure throws away more work.")
    if _close(value, expected * 60, rel=0.03):
        return wrong("The answer is asked in hours, not minutes.")
    if _close(value, math.sqrt(2 * 6 * 4), rel=0.03):
        return wrong("Put both times in the same unit before you multiply them.")
    return wrong("Young's rule is sqrt(2 x time to write a checkpoint x mean time between "
                 "failures), with both times in hours.")
