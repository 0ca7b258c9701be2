"""Sending each kept assignment to the rank that holds its expert, and its output back.

Expert ``e`` lives on rank ``e // E_local`` of the expert-parallel group (``E_local = E / n``
consecutive experts per rank). One forward pass of :class:`AllToAllDispatcher`:

1. sort this rank's kept assignments (token t, choice j) by expert, so that each
   destination's rows are one block, and copy the token's vector into each row (a token
   chosen twice by experts of one rank travels twice: the naive dispatch);
2. tell every rank how many rows of each of its experts are coming (a small all-to-all of
   counts), then all-to-all the rows;
3. run each local expert on the rows received for it;
4. all-to-all the outputs back the same way, and put each in its (t, j) place.

Two layouts of what travels:

- ``"uneven"``: exactly the kept rows; ``input_splits`` differ from rank to rank (and may be
  0), so nothing is padded, at the price of the count exchange first;
- ``"capacity"``: fixed buffers of ``E x capacity`` rows per rank (GShard, Switch), a kept
  assignment in row ``slot`` of its expert's block, zeros elsewhere. Every split is equal
  and known in advance, and the padding travels and is computed on.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from parlab.comm import all_to_all

__all__ = ["AllToAllDispatcher", "LAYOUTS"]

LAYOUTS = ("uneven", "capacity")


class AllToAllDispatcher:
    """Runs this rank's experts (the layer passes them: on rank r of ``group``, global ids
    ``r E_local .. (r + 1) E_local - 1`` of ``n_experts``) on the assignments every rank of
    ``group`` routes to them."""

    def __init__(self, n_experts: int, group=None, layout: str = "uneven"):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
        self.n_experts, self.group, self.layout = n_experts, group, layout
        self.size = dist.get_world_size(group)

    def __call__(self, experts, x, choices, slot, kept, capacity=None):
        k = choices.shape[1]
        flat = choices.reshape(-1)
        rows = torch.nonzero(kept.reshape(-1)).squeeze(1)
        rows = rows[torch.argsort(flat[rows], stable=True)]   # by expert, then queue order
        if self.layout == "uneven":
            back = self._uneven(experts, x[rows // k], flat[rows])
        else:
            back = self._capacity(experts, x[rows // k], flat[rows], slot.reshape(-1)[rows],
                                  capacity)
        y = x.new_zeros(flat.numel(), x.shape[-1]).index_copy(0, rows, back)
        return y.view(*choices.shape, -1)

    @staticmethod
    def _run_local(experts, received, local_ids):
        """Every local expert on its rows, even on none: the backward pass then reaches both
        all-to-alls on every rank, as a collective must (a rank that received no rows and
        skipped its experts would skip the backward all-to-alls the others wait in)."""
        out = torch.zeros_like(received)
        for e, expert in enumerate(experts):
            idx = torch.nonzero(local_ids == e).squeeze(1)
            out = out.index_copy(0, idx, expert(received[idx]))
        return out

    def _uneven(self, experts, send, expert_ids):
        n, n_local = self.size, len(experts)
        per_expert = torch.bincount(expert_ids, minlength=self.n_experts)
        counts = torch.empty_like(per_expert)
        dist.all_to_all_single(counts, per_expert, group=self.group)
        counts = counts.view(n, n_local)                       # [source rank, local expert]
        input_splits = per_expert.view(n, n_local).sum(1).tolist()
        output_splits = counts.sum(1).tolist()
        received = all_to_all(send, output_splits, input_splits, self.group)
        local_ids = torch.arange(n_local).repeat(n).repeat_interleave(counts.reshape(-1))
        out = self._run_local(experts, received, local_ids)
        return all_to_all(out, input_splits, output_splits, self.group)

    def _capacity(self, experts, send, expert_ids, slots, capacity):
        if capacity is None:
            raise ValueError("the 'capacity' layout sends fixed buffers of experts x capacity "
                             "rows, so it needs MoEConfig.capacity_factor; layout='uneven' "
                             "keeps every token without one")
        n, n_local = self.size, len(experts)
        place = expert_ids * capacity + slots                 # row in this rank's buffer
        buffer = send.new_zeros(self.n_experts * capacity, send.shape[-1])
        buffer = buffer.index_copy(0, place, send)
        splits = [n_local * capacity] * n
        received = all_to_all(buffer, splits, splits, self.group)
        local_ids = torch.arange(n_local).repeat_interleave(capacity).repeat(n)
        out = self._run_local(experts, received, local_ids)
        return all_to_all(out, splits, splits, self.group)[place]
