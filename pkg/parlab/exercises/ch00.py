"""Chapter 00 exercises: predict a collective, then write one."""

from __future__ import annotations

from . import exercise, right, wrong


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
    from ..launch import run
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
