"""Chapter 00 exercises: predict a collective, then write one."""

from __future__ import annotations

from parlab.exercises.registry import exercise, right, wrong


@exercise("00.1", "Four ranks each hold torch.tensor([rank + 1.0]). After dist.all_reduce "
                  "(SUM), which number does rank 3 hold?")
def _predict_all_reduce(answer):
    expected = float(sum(r + 1 for r in range(4)))
    if float(answer) == expected:
        return right("Every rank ends with the same total: all_reduce sums and shares.")
    if float(answer) == 4.0:
        return wrong("That is rank 3's own value. all_reduce replaces it with something "
                     "computed from every rank's value.")
    return wrong("Add up what the four ranks hold before the call; every rank gets the result.")


@exercise("00.2", "Write fn() for launch.run so that every rank returns the sum over all ranks "
                  "of rank**2, using one collective.")
def _write_sum_of_squares(answer):
    import torch.distributed as dist  # noqa: F401  (the reader's fn uses it)
    from parlab.launch import run
    if not callable(answer):
        return wrong("Pass the function itself (fn, not fn()).")
    for world_size in (2, 3):
        expected = float(sum(r * r for r in range(world_size)))
        got = run(answer, world_size, timeout=20)
        if any(g is None for g in got):
            return wrong("fn returns None on some rank: return the reduced number.")
        values = [float(g.item() if hasattr(g, "item") else g) for g in got]
        if values != [expected] * world_size:
            return wrong(f"On {world_size} ranks the ranks returned {values}. Start each rank "
                         f"with its own rank**2, then reduce with the default operation.")
    return right("One all_reduce gives every rank the same sum, whatever the world size.")


@exercise("00.3", "A ring all_reduce runs on 4 ranks over a tensor of 1 MiB (1,048,576 bytes). "
                  "How many bytes does each rank send?")
def _predict_ring_bytes(answer):
    from parlab.comm import allreduce_bytes_per_rank
    nbytes, n = 2**20, 4
    expected = allreduce_bytes_per_rank(nbytes, n, "ring")[0]
    value = float(answer)
    if value == expected:
        return right("Two phases of n-1 steps, one chunk of 1/n of the tensor per step: "
                     "2(n-1)/n of the tensor, whatever the rank.")
    if value == nbytes:
        return wrong("That is the whole tensor, sent once. In a ring a rank sends one chunk "
                     "(1/n of the tensor) per step; count the steps of both phases.")
    if value == (n - 1) * nbytes:
        return wrong("That is what the root of the naive algorithm sends. In a ring every rank "
                     "sends only chunks: one per step.")
    if value in (2 * (n - 1) * nbytes, (n - 1) * nbytes / n):
        return wrong("Close: check both the number of steps (each phase has n-1) and the size "
                     "of one message (a chunk is 1/n of the tensor).")
    return wrong("Count the steps (reduce-scatter then all-gather, n-1 steps each) and multiply "
                 "by the bytes of one chunk. run_with_traffic can show you the log.")


def _broadcast_steps(n: int, algorithm: str) -> int:
    """Steps of a broadcast from rank 0 to ``n`` ranks, counted from a real toy-backend run."""
    from parlab.comm import one_collective, run_with_traffic
    _, log = run_with_traffic(one_collective, n, "broadcast", 4, algorithm=algorithm)
    return len(log.per_step())


@exercise("00.4", "Rank 0 broadcasts a tensor to 8 ranks. Passed along the ring it takes 7 "
                  "steps. How many steps does the tree algorithm take?")
def _predict_tree_broadcast(answer):
    value = int(answer)
    n = 8
    expected = _broadcast_steps(n, "tree")
    if value == expected:
        return right("Every rank that already has the tensor passes it on in the next step, so "
                     "the number of ranks holding it doubles: log2(n) steps.")
    if value == _broadcast_steps(n, "ring"):
        return wrong("That is the ring. In a tree, each rank that has the tensor sends it on "
                     "at once, so more ranks send in each step.")
    if value == 1:
        return wrong("One step is the naive algorithm, where rank 0 sends to all 7 others "
                     "itself and its network card carries 7 copies. The tree shares that work.")
    return wrong("Count how many ranks hold the tensor after each step: 1, then 2, then ... "
                 "The explorer above (broadcast, tree, 8 ranks) draws every step.")
