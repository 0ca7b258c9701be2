"""Chapter 07 exercises: an expert's capacity, the bytes of a dispatch, a token's active
parameters, and a small run with fewer ranks.

Each expected answer is computed when the checker runs, from the functions the notebook uses
(:func:`parlab.models.expert_capacity`, :func:`parlab.expert_parallel.dispatch_bytes`,
:func:`parlab.models.count_parameters`) or from a real run on the toy backend; a wrong answer
gets a hint, never the number.
"""

from __future__ import annotations

from parlab.expert_parallel import dispatch_bytes
from parlab.exercises.registry import close, exercise, right, wrong
from parlab.experiments import EXAMPLE, TOKENS, run_expert_layer
from parlab.models import count_parameters, expert_capacity


#: The capacity factor exercise 07.1 asks about (the chapter's layer uses 1.0).
FACTOR_07_1 = 1.25


@exercise("07.1", "The example layer has 4 experts and top-2 routing, and each rank routes its "
                  "own 8 tokens. With a capacity factor of 1.25 instead of 1.0, how many "
                  "assignments can one expert take from one rank?")
def _capacity(answer):
    c = EXAMPLE
    expected = expert_capacity(TOKENS, c.n_experts, c.top_k, FACTOR_07_1)
    value = float(answer)
    if value == expected:
        return right("k x T x factor / E = 2 x 8 x 1.25 / 4 = 5: an even share of the rank's "
                     "16 assignments, plus a quarter, rounded up.")
    if value == expert_capacity(TOKENS, c.n_experts, c.top_k, c.capacity_factor):
        return wrong("That is the capacity at the example's factor, 1.0. Scale by 1.25.")
    if value == TOKENS * FACTOR_07_1 / c.n_experts or value == -(-TOKENS * FACTOR_07_1 //
                                                                 c.n_experts):
        return wrong("Each token makes k choices, not one: count assignments, not tokens.")
    return wrong("Count the assignments a rank makes (tokens x k), share them evenly over the "
                 "experts, scale by the capacity factor and round up.")


@exercise("07.2", "With an even load, how many bytes does one of the 4 ranks send in one "
                  "dispatch of the example layer (8 tokens, top-2, d_model 8, fp32)?")
def _dispatch(answer):
    c = EXAMPLE
    expected = dispatch_bytes(TOKENS, c.top_k, c.d_model, 4)
    value = float(answer)
    if close(value, expected, rel=0.001):
        return right("k T d b = 2 x 8 x 8 x 4 = 512 bytes leave the router, and a quarter of "
                     "them go to experts on the rank itself: (n-1)/n travels.")
    if close(value, expected * 4 / 3, rel=0.001):
        return wrong("Some assignments go to this rank's own experts: they never leave.")
    if close(value, expected / c.top_k, rel=0.001):
        return wrong("A token travels once per chosen expert, so top-2 sends it twice.")
    return wrong("Multiply tokens x k x d_model x 4 bytes, then keep the share that goes to the "
                 "other ranks.")


@exercise("07.3", "Mixtral-8x7B has 46.70 billion parameters. Each of its 32 blocks has 8 "
                  "experts of 3 x 4096 x 14336 weights, and a token uses 2 of them (and "
                  "everything outside the experts). How many billion parameters does one token "
                  "use? Two decimals.")
def _active(answer):
    counts = count_parameters("Mixtral-8x7B")
    value = float(answer)
    if close(value, counts["active"] / 1e9, rel=0.002):
        return right("12.88 B of 46.70 B: the experts are most of the model, and a token skips "
                     "six of each layer's eight.")
    if close(value, counts["total"] / 1e9 * 2 / 8, rel=0.01):
        return wrong("Only the experts are skipped: attention, the router and the embeddings "
                     "serve every token.")
    if close(value, counts["total"] / 1e9, rel=0.01):
        return wrong("That is every parameter. Which ones does a token never touch?")
    return wrong("Start from the total, 46.70 B, and remove the 6 experts per layer a token "
                 "does not use: each is 3 x 4096 x 14336 parameters, in 32 layers.")


@exercise("07.4", "Predict with the closed form how many bytes rank 0 sends in one dispatch "
                  "when the example layer runs on 2 ranks. Then run "
                  "result = run_expert_layer(ranks=2) and answer with what rank 0 really sent, "
                  "sum(result.matrix[0]).")
def _two_ranks(answer):
    result = run_expert_layer(ranks=2)
    expected = sum(result.matrix[0])
    value = float(answer)
    if value == expected:
        return right("With 2 ranks half of each rank's assignments stay home: the closed form "
                     f"says {result.closed_form:.0f} B for an even load, and the real routing "
                     f"sent {expected} B.")
    if close(value, result.closed_form, rel=0.001):
        return wrong("That is the closed form, a good prediction for an even load. Now run it: "
                     "the real routing is not exactly even, and capacity drops some "
                     "assignments. Read row 0 of the run's matrix.")
    return wrong("Sum row 0 of result.matrix (bytes rank 0 sent each rank).")
