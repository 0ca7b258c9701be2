"""Chapter 01 exercises: put bytes, GPUs and dollars on Figure 8-1 and the power example.

Every expected answer is computed by the package (``parlab.memory``, ``parlab.models``,
``parlab.memory.energy``, Figure 8-1's step) when the checker runs, so it cannot drift from
what the notebook shows; a wrong answer gets a hint, never the number.
"""

from __future__ import annotations

import math

from parlab.hardware import GPU_MEMORY_GB
from parlab.exercises.registry import close, exercise, right, wrong



@exercise("01.1", "GPU A1 trains the (4, 5, 5, 2) network on its own half (4 samples) of the "
                  "batch of 8 and receives A2's gradients for every weight and bias. How many "
                  "bytes does A1 hold in all, counted as in the table of the lone GPU?")
def _a1_with_peer(answer):
    from parlab.models import bytes_by_scaling
    from parlab.experiments import book_step
    alone = bytes_by_scaling(book_step(with_peer=False))
    a1 = bytes_by_scaling(book_step(with_peer=True))
    expected, whole = sum(a1.values()), sum(alone.values())
    remote = a1["parameters"] - alone["parameters"]
    value = float(answer)
    if value == expected:
        return right("Every row that has one line per sample (the data, z, y, E) halves; every "
                     "row with one number per weight stays, and the remote gradients add one "
                     "more such copy. Here the halving saves more than the copy costs.")
    if value == whole:
        return wrong("That is the lone GPU's total. A1 sees only half of the samples.")
    if value == whole + remote:
        return wrong("You added A2's gradients. Which rows shrink when A1 trains on 4 samples "
                     "instead of 8?")
    if value == expected - remote:
        return wrong("You halved the rows that follow the batch. What does A1 receive from A2, "
                     "and how large is it?")
    if value in (whole / 2, whole / 2 + remote):
        return wrong("Not every row follows the batch: which ones have one number per weight, "
                     "whatever the batch?")
    return wrong("Sort the lone GPU's rows into those with one line per sample and those with "
                 "one number per weight or bias; halve the first kind, and add one more copy of "
                 "the per-weight gradients.")


@exercise("01.2", "GPT-3 175B is trained in bf16 mixed precision with Adam (bf16 weights and "
                  "gradients, fp32 master weights and Adam state). Ignoring activations, how "
                  f"many {GPU_MEMORY_GB} GB GPUs (1 GB = 10**9 bytes) are needed at least just "
                  "to hold it?")
def _gpt3_gpus(answer):
    from parlab.units import GB
    from parlab.models import GPT3_175B, count_parameters
    n = count_parameters(GPT3_175B)["total"]
    per_param = 2 + 2 + 4 + 8
    expected = math.ceil(n * per_param / (GPU_MEMORY_GB * GB))
    value = float(answer)
    if value == expected:
        return right("16 bytes per parameter (2 + 2 + 4 + 4 + 4) for about 175 billion "
                     "parameters, spread perfectly evenly; real splits need more.")
    if value != int(value) or value < 1:
        return wrong("A number of GPUs is a whole number: round up.")
    if value == math.ceil(n * per_param / (GPU_MEMORY_GB * 2**30)):
        return wrong("You used GiB (2**30 bytes); this exercise counts GB as 10**9 bytes.")
    if value == math.ceil(n * 2 / (GPU_MEMORY_GB * GB)):
        return wrong("That holds the bf16 weights only. Training also keeps gradients, the "
                     "fp32 master copy and Adam's two moments.")
    if value in (math.ceil(n * 12 / (GPU_MEMORY_GB * GB)),
                 math.ceil(n * 14 / (GPU_MEMORY_GB * GB))):
        return wrong("Close: list every copy the GPU keeps per parameter, in bf16 and in "
                     "fp32, and add their bytes.")
    if value == math.floor(n * per_param / (GPU_MEMORY_GB * GB)):
        return wrong("Round up: a fraction of a GPU still takes a whole GPU.")
    return wrong("Count the bytes per parameter for each copy (weights, gradients, master "
                 "weights, two Adam moments), multiply by the parameter count of GPT-3 175B, "
                 f"and divide by {GPU_MEMORY_GB} GB.")


@exercise("01.3", "The book's run (50,000 GPUs at 350 W, $0.10 per kWh) loses one packet, and "
                  "the RDMA transport resends it after one acknowledgement timeout of "
                  "4.096 us x 2**20 (NCCL's default). Every GPU waits meanwhile. What does the "
                  "wait cost in electricity, in USD?")
def _lost_packet(answer):
    from parlab.memory import rdma_retry_times, training_cost
    run = training_cost(gpus=50_000, watts_per_gpu=350, days=60, usd_per_kwh=0.10)
    times = rdma_retry_times()
    expected = run.usd_per_hour * times.wait_s / 3600
    value = float(answer)
    if close(value, expected, rel=0.03):
        return right("A few dollars: a lost packet costs time, not the run. What costs the "
                     "run is a transfer that never completes.")
    if close(value, run.usd_per_hour * times.give_up_s / 3600, rel=0.03):
        return wrong("That is the wait until the transport gives up after every retry. One "
                     "lost packet is resent after the first timeout.")
    if close(value, run.power_mw * 1000 * times.wait_s / 3600, rel=0.03):
        return wrong("That is the energy in kWh. Multiply by the price per kWh.")
    if close(value, run.usd_per_hour, rel=0.03):
        return wrong("That is an hour of the run. How long is the wait, in hours?")
    return wrong("Work out the wait in seconds, the power of the whole cluster in kW, the "
                 "energy of the wait in kWh, and its price.")


@exercise("01.4", "A job fails on average every 4 hours, and writing a checkpoint takes 6 "
                  "minutes. By Young's rule, every how many hours should it checkpoint?")
def _young(answer):
    from parlab.memory import young_interval
    expected = young_interval(mtbf_hours=4, checkpoint_minutes=6)
    value = float(answer)
    if close(value, expected, rel=0.03):
        return right("sqrt(2 x checkpoint time x MTBF): checkpoint too often and the writes "
                     "cost time, too rarely and each failure throws away more work.")
    if close(value, expected * 60, rel=0.03):
        return wrong("The answer is asked in hours, not minutes.")
    if close(value, math.sqrt(2 * 6 * 4), rel=0.03):
        return wrong("Put both times in the same unit before you multiply them.")
    return wrong("Young's rule is sqrt(2 x time to write a checkpoint x mean time between "
                 "failures), with both times in hours.")
