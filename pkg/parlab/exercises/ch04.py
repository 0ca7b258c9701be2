"""Chapter 04 exercises: count a sharded layer, then predict the bytes of the Megatron MLP, of the
book's attention and of Figure 8-19's rails before the notebook prints them, and find where
a layer split stops paying off against data parallelism.

Each expected answer is computed when the checker runs, from the formulas the chapter's
tests check against the toy backend's log (:mod:`parlab.tensor_parallel.counting`,
:func:`parlab.comm.ring_wire_bytes`); a wrong answer gets a hint, never the number. The
worked solutions are in :mod:`parlab.exercises.ch04_solutions`, which the notebook does
not import: a reader opens it by choice.
"""

from __future__ import annotations

from parlab.exercises.registry import exercise, number, right, wrong

_TP = 8
#: The sizes of the chapter's small runs: batch 2 x 4 tokens x d_model 8, fp32, 2 GPUs.
_BATCH, _SEQ, _D_MODEL, _D_FF, _GPUS, _FP32 = 2, 4, 8, 32, 2, 4
#: Exercise 04.5's layer (a size the notebook never runs).
_C_IN, _C_OUT = 64, 96


def _attention_weights_per_gpu() -> int:
    """04.1: W_Q, W_K, W_V, W_O of GPT-3 175B, no biases, on one of 8 GPUs."""
    from parlab.models import GPT3_175B
    return 4 * GPT3_175B.d_model ** 2 // _TP


def _mlp_forward_wire_bytes() -> int:
    """04.2: the Megatron MLP's forward pass on the chapter's sizes, bytes on the wire."""
    from parlab.comm import ring_wire_bytes
    x_bytes = _BATCH * _SEQ * _D_MODEL * _FP32  # the all-reduce sums a tensor of X's size
    return int(ring_wire_bytes("all_reduce", x_bytes, _GPUS))


def _book_forward_wire_bytes() -> int:
    """04.3: the book's attention forward pass (broadcast, two all-gathers, one all-reduce)."""
    from parlab.tensor_parallel import attention_bytes, total
    return int(total(attention_bytes("book", _BATCH, _SEQ, _D_MODEL, _GPUS))["forward"])


def _ffn_forward_bytes() -> dict:
    """04.4: Figure 8-19's forward pass, bytes per link type, batch 4 in fp32."""
    from parlab.tensor_parallel import FIGURE_8_19_SIZES, ffn_bytes
    return ffn_bytes(FIGURE_8_19_SIZES, tensor=2, batch=4)["forward"]


def _step_bytes(strategy: str, batch: int) -> float:
    from parlab.tensor_parallel import strategy_bytes, total
    return sum(total(strategy_bytes(strategy, batch, _C_IN, _C_OUT, _GPUS)).values())


def _largest_reduce_output_batch() -> int:
    """04.5: the largest batch at which reduce-output's step moves no more than data's."""
    batch = 0
    while _step_bytes("reduce_output", batch + 1) <= _step_bytes("data", batch + 1):
        batch += 1
    return batch


@exercise("04.1", "GPT-3 175B with tensor-parallel degree 8: how many parameters of one "
                  "attention layer's four weight matrices (W_Q, W_K, W_V, W_O; no biases) "
                  "does one GPU hold?")
def _attention_share(answer):
    from parlab.models import GPT3_175B
    d, expected = GPT3_175B.d_model, _attention_weights_per_gpu()
    value = number(answer)
    if value == expected:
        return right("Each of the four d x d matrices is cut into 8 equal pieces (by heads for "
                     "W_Q, W_K, W_V, by input features for W_O), so a GPU holds an eighth.")
    if value == 4 * d * d:
        return wrong("That is the whole layer. How much of it lands on one of the 8 GPUs?")
    if value == d * d // _TP:
        return wrong("That is one matrix's share; the layer has four weight matrices.")
    return wrong("Start from d_model = 12288: each projection is a d_model x d_model matrix. "
                 "Count the layer, then split it.")


@exercise("04.2", "The Megatron MLP (d_model 8, d_ff 32) on 2 GPUs, batch 2 x 4 tokens in fp32: "
                  "how many bytes does its forward pass put on the wire, both GPUs together?")
def _mlp_forward(answer):
    value, expected = number(answer), _mlp_forward_wire_bytes()
    x_bytes = _BATCH * _SEQ * _D_MODEL * _FP32
    hidden = _BATCH * _SEQ * _D_FF * _FP32
    if value == expected:
        return right("One all-reduce of a tensor the size of the layer's input: the hidden "
                     "layer, four times wider, never leaves the GPUs. On a ring each GPU sends "
                     "half the tensor to reduce and half to share back.")
    if value == x_bytes:
        return wrong("That is the size of the tensor being summed. An all-reduce on a ring "
                     "is a reduce-scatter followed by an all-gather: what does each GPU send "
                     "in each half?")
    if value in (hidden, 2 * hidden):
        return wrong("That counts the hidden layer's activations. Which tensor do the two GPUs "
                     "actually exchange: before fc2, or after it?")
    return wrong("Find the one collective of the forward pass and the shape of the tensor it "
                 "carries (it is not d_ff wide); then count what a ring of 2 GPUs sends for it.")


@exercise("04.3", "The book's attention (Figure 8-18) on 2 GPUs, batch 2 x 4 tokens, d_model 8, "
                  "fp32: how many bytes does its forward pass put on the wire, both GPUs "
                  "together?")
def _book_forward(answer):
    from parlab.comm import ring_wire_bytes
    value, expected = number(answer), _book_forward_wire_bytes()
    s = _BATCH * _SEQ * _D_MODEL * _FP32
    if value == expected:
        return right("The broadcast sends X once, each all-gather sends each GPU's half to the "
                     "other, and the all-reduce of the partial outputs costs twice its tensor "
                     "on a ring of two.")
    if value == expected - s:
        return wrong("Short by one tensor's worth. Either a collective is missing from your "
                     "list (how does A2 get X?), or the all-reduce counts its tensor once: on "
                     "a ring it is a reduce-scatter and an all-gather in one.")
    if value == expected - ring_wire_bytes("all_reduce", s, _GPUS):
        return wrong("Steps 1 to 4 are all there. What does it take to finish the layer "
                     "after the output projection?")
    return wrong("List the forward collectives of Figure 8-18 in order (what moves X, Q, K, "
                 "and the partial outputs), give each the size of its tensor, then apply what "
                 "each one sends on a ring of 2 GPUs.")


@exercise("04.4", "Figure 8-19 with 4 inputs and layers of 6, 4 and 2 neurons, a batch of 4 "
                  "context vectors in fp32 (4 bytes) in 2 micro-batches: how many bytes cross "
                  "the rail switches in the forward pass?")
def _rail_bytes(answer):
    links, value = _ffn_forward_bytes(), number(answer)
    if value == links["rail"]:
        return right("Only the hand-offs between stages cross a rail: each stage's whole output, "
                     "sent once per rail. The all-gathers stay on NVLink inside each server, "
                     "and splitting the batch into micro-batches changes the number of "
                     "messages, not their bytes.")
    if value == links["nvlink"]:
        return wrong("That is the all-gather traffic, which stays inside the servers (NVLink).")
    if value == links["rail"] / 2:
        return wrong("There are two rails: A1 sends to A2 and B1 to B2. Does each send half "
                     "of the stage's output, or all of it?")
    return wrong("Follow one context vector: which stage hands what to the next one, and "
                 "over which switch? Every GPU of a stage holds its stage's whole output "
                 "after the all-gather (batch x neurons x 4 bytes).")


@exercise("04.5", f"A linear layer with C_in = {_C_IN} and C_out = {_C_OUT} on 2 GPUs in fp32. "
                  "Counting everything a training step puts on the wire (forward and backward, "
                  "ring collectives), what is the largest batch B for which reduce-output "
                  "moves no more bytes than data parallelism?")
def _break_even(answer):
    value, expected = number(answer), _largest_reduce_output_batch()
    if value != int(value) or value < 1:
        return wrong("Give a whole, positive batch size.")
    if value == expected:
        return right("Data parallelism sums the weight gradient once per step, whatever the "
                     "batch; reduce-output sums the outputs forward and gathers the input "
                     "gradient backward, both growing with B. The slide's single count "
                     "leaves one of the two out, and ignores that an all-reduce costs twice.")
    if value == _C_OUT:
        return wrong("That is the slide's break-even (B x C_in against C_in x C_out), which "
                     "counts one tensor per strategy. Count every collective of the step.")
    if _step_bytes("reduce_output", int(value)) > _step_bytes("data", int(value)):
        return wrong("At that batch reduce-output already moves more than data parallelism.")
    return wrong("Reduce-output still moves less at that batch; try larger ones. Write both "
                 "strategies' step bytes as functions of B (or run run_layer_strategy on the "
                 "toy backend) and find where they cross.")
