"""What ``run`` returns: a list of the ranks' results that carries what its own run saw.

No record is kept between runs: two runs in a row, or a run inside a callback, each keep
their own traffic, spans and output.
"""

import pickle

import cloudpickle
import torch
import torch.distributed as dist

from parlab.comm import TrafficLog, run_with_traffic
from parlab.launch import recording, run, Run, Span, span


def _all_reduce(numel):
    t = torch.ones(numel)
    dist.all_reduce(t)
    return t[0].item()


def _ring_bytes_per_rank(numel, world):
    """A ring all-reduce sends 2(w-1) chunks of n/w floats (4 bytes each) from every rank."""
    return 2 * (world - 1) * (numel // world) * 4


def test_two_toy_runs_in_a_row_keep_their_own_traffic():
    small, _ = run_with_traffic(_all_reduce, 3, 6, algorithm="ring")
    large = run(_all_reduce, 3, 12, backend="toy")
    assert small == [3.0] * 3 and large == [3.0] * 3
    for result, numel in ((small, 6), (large, 12)):
        sent = result.traffic.filter(op="all_reduce").per_rank()["sent"]
        assert list(sent) == [_ring_bytes_per_rank(numel, 3)] * 3  # 32 B, then 64 B
    assert small.traffic.total_bytes() == 96 and large.traffic.total_bytes() == 192


def test_a_run_inside_a_callback_does_not_mix():
    seen = {}

    def on_change(numel):  # what a widget callback does: a launch of its own
        seen["inner"] = run_with_traffic(_all_reduce, 2, numel)

    outer = run(_all_reduce, 2, 4, backend="toy")
    on_change(8)  # after the outer run, before anyone reads its traffic
    inner, inner_log = seen["inner"]
    assert outer.traffic.filter(op="all_reduce").total_bytes() == 2 * _ring_bytes_per_rank(4, 2)
    assert inner_log.filter(op="all_reduce").total_bytes() == 2 * _ring_bytes_per_rank(8, 2)
    assert inner.traffic is inner_log and isinstance(inner_log, TrafficLog)


def _timed():
    with span("x", "compute", rank=dist.get_rank()):
        print("working")
    with recording() as mine:  # code that records its own spans inside fn keeps them
        with span("y", "communication"):
            pass
    return [s.name for s in mine.spans]


def test_run_is_a_list_with_spans_outputs_and_no_traffic_on_gloo():
    result = run(_timed, 2, backend="gloo")
    assert isinstance(result, Run) and isinstance(result, list)
    assert result == [["y"], ["y"]] and [["y"], ["y"]] == result
    assert repr(result) == repr([["y"], ["y"]])
    assert result.world_size == 2 and result.backend == "gloo" and result.seconds > 0
    assert result.outputs == ["working\n", "working\n"]
    assert result.traffic is None
    assert len(result.spans) == 2
    for rank, spans in enumerate(result.spans):
        assert all(isinstance(s, Span) for s in spans)
        assert [(s.name, s.cat) for s in spans] == [("x", "compute"), ("y", "communication")]
        assert spans[0].args == {"rank": rank}
    for dumps, loads in ((pickle.dumps, pickle.loads), (cloudpickle.dumps, pickle.loads)):
        back = loads(dumps(result))
        assert type(back) is Run and back == result and back.outputs == result.outputs
        assert back.spans == result.spans and back.traffic is None
