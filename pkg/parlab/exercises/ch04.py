"""Chapter 04 exercises: count a sharded layer, compare the attention splits, follow Figure 8-19's
bytes, and weigh the slide deck's strategies. The expected answers are computed by the
package (never typed in), so they follow the models and formulas the chapter uses."""

from __future__ import annotations

from parlab.exercises.registry import exercise, right, wrong

_TP = 8
_C_IN, _C_OUT = 1024, 4096


def _attention_params_per_gpu() -> int:
    from parlab.models import GPT3_175B
    return 4 * GPT3_175B.d_model ** 2 // _TP


def _ops_megatron_avoids() -> set:
    from parlab.tensor_parallel import attention_bytes
    book = attention_bytes("book", 2, 4, 8)["forward"]
    megatron = attention_bytes("megatron", 2, 4, 8)["forward"]
    return set(book) - set(megatron)


def _ffn_bytes() -> dict:
    from parlab.tensor_parallel import FIGURE_8_19_SIZES, ffn_bytes
    return ffn_bytes(FIGURE_8_19_SIZES, tensor=2, batch=4)["forward"]


def _largest_batch() -> int:
    from parlab.tensor_parallel import slide_costs
    batch = 1
    while slide_costs(batch + 1, _C_IN, _C_OUT)["partition_output"] <= _C_IN * _C_OUT:
        batch += 1
    return batch


def _answers() -> dict:
    """The right answers, computed (used by the tests; a reader solves them in the notebook)."""
    return {"04.1": _attention_params_per_gpu(), "04.2": _ops_megatron_avoids(),
            "04.3": int(_ffn_bytes()["rail"]), "04.4": _largest_batch()}


@exercise("04.1", "GPT-3 175B with tensor-parallel degree 8: how many parameters of one "
                  "attention layer's four weight matrices (W_Q, W_K, W_V, W_O; no biases) "
                  "does one GPU hold?")
def _attention_share(answer):
    from parlab.models import GPT3_175B
    d, expected = GPT3_175B.d_model, _attention_params_per_gpu()
    answer = int(answer)
    if answer == expected:
        return right("Each of the four d x d matrices is cut into 8 equal pieces (by heads for "
                     "W_Q, W_K, W_V, by input features for W_O), so a GPU holds an eighth.")
    if answer == 4 * d * d:
        return wrong("That is the whole layer. How much of it lands on one of the 8 GPUs?")
    if answer == d * d // _TP:
        return wrong("That is one matrix's share; the layer has four weight matrices.")
    return wrong("Start from d_model = 12288: each projection is d_model x d_model.")


@exercise("04.2", "The book's attention forward pass on 2 ranks uses broadcast, all_gather and "
                  "all_reduce. Which of these does Megatron's split (whole heads per rank) not "
                  "need? Answer a set of names.")
def _avoided(answer):
    if isinstance(answer, str) or not hasattr(answer, "__iter__"):
        return wrong("Answer a set of collective names, such as {'all_reduce'}.")
    given, expected = {str(a) for a in answer}, _ops_megatron_avoids()
    if given == expected:
        return right("A head's scores need only its own Q and K columns, which a rank that owns "
                     "the head computed itself; and a replicated input needs no broadcast. "
                     "Only the output's all-reduce is left.")
    if given - {"broadcast", "all_gather", "all_reduce"}:
        return wrong("Use the names from the question: broadcast, all_gather, all_reduce.")
    if "all_reduce" in given:
        return wrong("Both splits still have to add up the partial outputs of W_O.")
    return wrong("Ask, for each collective, whether a rank that owns whole heads and already "
                 "has the input could do without it.")


@exercise("04.3", "Figure 8-19 with 4 inputs and layers of 6, 4 and 2 neurons, a batch of 4 "
                  "context vectors in fp32 (4 bytes): how many bytes cross the rail switches "
                  "in the forward pass?")
def _rail_bytes(answer):
    links = _ffn_bytes()
    answer = float(answer)
    if answer == links["rail"]:
        return right("Only the hand-offs between stages cross a rail: each stage's whole output, "
                     "sent once per rail. The all-gathers stay on NVLink inside each server.")
    if answer == links["nvlink"]:
        return wrong("That is the all-gather traffic, which stays inside the servers (NVLink).")
    if answer == links["rail"] / 2:
        return wrong("There are two rails: A1 sends to A2 and B1 to B2, each the whole output.")
    return wrong("Count the sends from H1 to H2 and from H2 to the output layer: every GPU of a "
                 "stage sends its stage's whole output (batch x neurons x 4 bytes).")


@exercise("04.4", f"A layer with C_in = {_C_IN} and C_out = {_C_OUT}: what is the largest batch B "
                  "for which partition-output (B x C_out numbers) moves no more than data "
                  "parallelism (C_in x C_out)?")
def _break_even(answer):
    expected = _largest_batch()
    answer = int(answer)
    if answer == expected:
        return right("B x C_out <= C_in x C_out exactly when B <= C_in: tensor parallelism pays "
                     "off when the batch is small compared with the layer's width.")
    if answer == _C_OUT:
        return wrong("C_out appears on both sides of the inequality; it cancels.")
    return wrong("Write B x C_out <= C_in x C_out and solve for B.")
