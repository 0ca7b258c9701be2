"""Chapter 08 exercises: ring attention's bytes, the contiguous layout's imbalance, and
Ulysses on 2 ranks.

Each expected answer is computed when the checker runs, from the functions the notebook uses
(:func:`parlab.context_parallel.ring_bytes`, :func:`parlab.context_parallel.causal_pairs`) or
from a real run on the toy backend (:func:`parlab.experiments.compare_methods`); a wrong answer
gets a hint, never the number.
"""

from __future__ import annotations

from parlab.context_parallel import causal_pairs, ring_bytes, ulysses_bytes
from parlab.exercises.registry import close, exercise, right, wrong
from parlab.experiments import compare_methods, CONTEXT_RANKS, CONTEXT_SHAPE

#: Exercise 08.2's ranks, and the sequence long enough for blocks of many tokens.
RANKS_08_2, SEQ_08_2 = 8, 8192


def _kv_shard_bytes(world: int = CONTEXT_RANKS) -> int:
    b, h, s, d = CONTEXT_SHAPE
    return b * h * (s // world) * d * 8  # float64


@exercise("08.1", "The example: one sequence of 16 tokens, 4 heads of width 4, float64, on 4 "
                  "ranks. How many bytes does one rank send in ring attention's forward pass?")
def _ring_forward(answer):
    expected = ring_bytes(_kv_shard_bytes(), CONTEXT_RANKS)["forward"]
    value = float(answer)
    if value == expected:
        return right("Each rank passes on p - 1 = 3 key/value blocks, each a K and a V shard of "
                     "4 tokens x 4 heads x 4 x 8 bytes: 3 x 2 x 512.")
    if value == expected // 2:
        return wrong("Keys and values both travel: two shards per step.")
    if value == expected * CONTEXT_RANKS // (CONTEXT_RANKS - 1):
        return wrong("A rank starts with its own block: the last step needs no transfer.")
    return wrong("Count the steps that need a new block, and the bytes of one rank's K and V.")


@exercise("08.2", "Causal attention on 8 ranks, contiguous layout, a long sequence: how many "
                  "times the first rank's unmasked (query, key) pairs does the last rank have?")
def _imbalance(answer):
    pairs = causal_pairs(SEQ_08_2, RANKS_08_2, "contiguous")
    expected = pairs[-1] / pairs[0]
    value = float(answer)
    if close(value, expected, rel=0.01):
        return right("2p - 1 = 15: the first rank has half a block (its diagonal), the last "
                     "seven whole blocks and half of its diagonal one.")
    if close(value, RANKS_08_2, rel=0.01):
        return wrong("That is the ratio of blocks computed, counting the diagonal block whole. "
                     "Only about half of a diagonal block is unmasked.")
    return wrong("Count blocks of S/p x S/p: rank r has r whole blocks before its diagonal, "
                 "and about half of the diagonal one.")


@exercise("08.3", "Predict how many bytes one rank sends in Ulysses' forward pass when the "
                  "example runs on 2 ranks. Then run "
                  "result = compare_methods(('ulysses',), world=2)[0] and answer with "
                  "result.sent['forward'][0].")
def _ulysses_two(answer):
    result = compare_methods(("ulysses",), world=2)[0]
    expected = result.sent["forward"][0]
    value = float(answer)
    if value == expected:
        return right("Each all-to-all keeps half of its data home on 2 ranks: (p - 1)/p of "
                     "Q, K, V out and of the output back.")
    q = _kv_shard_bytes(2)
    if close(value, ulysses_bytes(q, 2)["forward"] * 2, rel=0.001):
        return wrong("The 1/p of each tensor that belongs to the rank itself stays home.")
    return wrong("Add the Q, K and V shards sent out and the output shard sent back, and keep "
                 "the (p - 1)/p that leaves the rank.")
