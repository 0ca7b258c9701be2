"""Traces (issue 18 §3): each rank's compute and communication spans as a Chrome trace.

Checked against independent references: the schedule's own action table
(``pipeline_order``), the toy backend's log of what each rank sent, the tensor sizes worked
out from the network's widths, and the model's parameter shapes.
"""
import gzip
import json
from collections import Counter

import matplotlib
import pytest

from parlab import data_parallel as dp
from parlab.comm import chrome_trace, load_trace, trace_summary
from parlab.launch import recording, span, Span
from parlab.pipeline import execute, schedule

matplotlib.use("Agg")

NS = 1e-3  # one nanosecond in the trace's microseconds: the rounding of ts and dur


@pytest.fixture(scope="module")
def book_run():
    """The book's schedule on 4 toy-backend ranks: spans, and the backend's own message log."""
    return execute(schedule("book", stages=4, microbatches=4), backend="toy")


@pytest.fixture(scope="module")
def book_trace(book_run, tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "pipeline_trace.json"
    book_run.chrome_trace(path)
    with open(path) as f:
        return json.load(f)


def _spans(trace, pid=None, cat=None):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"
            and (pid is None or e["pid"] == pid) and (cat is None or e["cat"] == cat)]


def _metadata(trace, name):
    return {(e["pid"], e["tid"]): e["args"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == name}


# --------------------------------------------------------------------------- the pipeline


def test_pipeline_trace_parses_with_one_track_per_rank(book_trace):
    assert book_trace["displayTimeUnit"] == "ms"
    processes = _metadata(book_trace, "process_name")
    assert {pid: args["name"] for (pid, _), args in processes.items()} == {
        0: "rank 0 (A1)", 1: "rank 1 (A2)", 2: "rank 2 (B1)", 3: "rank 3 (B2)"}
    assert {e["pid"] for e in _spans(book_trace)} == {0, 1, 2, 3}
    threads = _metadata(book_trace, "thread_name")
    assert {key: args["name"] for key, args in threads.items()} == {
        (r, t): name for r in range(4) for t, name in enumerate(("compute", "communication"))}
    for e in _spans(book_trace):  # torch.profiler's fields for a complete event
        assert {"ph", "name", "cat", "pid", "tid", "ts", "dur", "args"} <= set(e)
        assert e["tid"] == (0 if e["cat"] == "compute" else 1) and e["dur"] >= 0
    assert min(e["ts"] for e in _spans(book_trace)) == 0  # counted from the earliest span


def test_each_ranks_compute_spans_are_its_actions_in_the_schedule(book_trace):
    order = schedule("book", stages=4, microbatches=4).pipeline_order
    for rank, entries in order.items():
        expected = []  # the table PyTorch's form gives: an action, a pair, or None per step
        for step, entry in enumerate(entries, start=1):
            for action in ((entry,) if isinstance(entry, str) else entry or ()):
                expected.append((step, str(action)))
        spans = sorted(_spans(book_trace, rank, "compute"), key=lambda e: e["ts"])
        assert [(e["args"]["step"], e["name"]) for e in spans] == expected
    assert len(_spans(book_trace, cat="compute")) == 32  # 4 micro-batches x 4 stages x F, B


def test_spans_on_one_row_do_not_overlap(book_trace):
    for rank in range(4):
        for cat in ("compute", "communication"):
            spans = sorted(_spans(book_trace, rank, cat), key=lambda e: e["ts"])
            for a, b in zip(spans, spans[1:]):
                assert a["ts"] + a["dur"] <= b["ts"] + NS, (rank, a["name"], b["name"])


def test_send_spans_are_on_the_sender_with_the_bytes_the_backend_logged(book_run, book_trace):
    # 8 samples in 4 micro-batches, boundary width 4, float32: 2 x 4 x 4 bytes per message
    per_message = 8 // 4 * 4 * 4
    logged = [m for step in book_run.traffic_by_step for m in step]
    assert len(logged) == 24
    for rank in range(4):
        sends = [e for e in _spans(book_trace, rank, "communication") if e["args"]["op"] == "send"]
        recvs = [e for e in _spans(book_trace, rank, "communication") if e["args"]["op"] == "recv"]
        assert Counter((e["args"]["peer"], e["args"]["bytes"]) for e in sends) == \
            Counter((m.dst, m.nbytes) for m in logged if m.src == rank)
        assert Counter(e["args"]["peer"] for e in recvs) == \
            Counter(m.src for m in logged if m.dst == rank)
        assert all(e["args"]["bytes"] == per_message for e in sends + recvs)


def test_clocks_line_up_across_ranks(book_trace):
    """A message is received after it was sent, and used after it was received."""
    flows = {}
    for e in book_trace["traceEvents"]:
        if e["ph"] in ("s", "f"):
            flows.setdefault(e["id"], {})[e["ph"]] = e
    assert len(flows) == 24 and all(set(pair) == {"s", "f"} for pair in flows.values())
    sends = {(e["pid"], e["args"]["peer"], e["args"]["tensor"]): e
             for e in _spans(book_trace, cat="communication") if e["args"]["op"] == "send"}
    for e in _spans(book_trace, cat="communication"):
        if e["args"]["op"] == "recv":
            sent = sends[(e["args"]["peer"], e["pid"], e["args"]["tensor"])]
            assert sent["ts"] <= e["ts"] + e["dur"] + NS  # not received before it was sent
            kind, microbatch = e["name"].split()[1][1], int(e["name"].split()[1][2:])
            stage = int(e["name"].split()[1][0]) + (1 if kind == "F" else -1)
            user = next(c for c in _spans(book_trace, e["pid"], "compute")
                        if c["name"] == f"{stage}{kind}{microbatch}")
            assert user["ts"] + NS >= e["ts"] + e["dur"]  # used only after it arrived


def test_summary_counts_and_gzip_round_trip(book_run, tmp_path):
    trace = book_run.chrome_trace()
    rows = trace_summary(trace)
    assert [r["track"] for r in rows] == ["rank 0 (A1)", "rank 1 (A2)", "rank 2 (B1)",
                                          "rank 3 (B2)"]
    # the ends of the pipeline talk to one neighbour, the middle ranks to two
    assert [(r["compute spans"], r["communication spans"]) for r in rows] == \
        [(8, 8), (8, 16), (8, 16), (8, 8)]
    assert all(r["idle ms"] >= 0 for r in rows)
    path = tmp_path / "t.json.gz"
    assert book_run.chrome_trace(path) == trace  # the same spans give the same trace
    with gzip.open(path, "rt") as f:
        assert json.load(f) == json.loads(json.dumps(trace))
    assert load_trace(path)["traceEvents"] == json.loads(json.dumps(trace))["traceEvents"]


def test_trace_figure_draws_one_row_per_rank(book_run):
    from parlab.viz.plots import trace_figure

    trace = book_run.chrome_trace()
    fig = trace_figure(trace, book_run.simulation)
    gantt, measured = fig.axes
    assert [t.get_text() for t in measured.get_yticklabels()] == [
        "rank 0 (A1)", "rank 1 (A2)", "rank 2 (B1)", "rank 3 (B2)"]
    assert len(measured.patches) == len(_spans(trace))
    assert [t.get_text() for t in gantt.get_yticklabels()] == ["A1", "A2", "B1", "B2"]


# --------------------------------------------------------------------------- data parallel


def test_data_parallel_trace_has_one_all_reduce_per_bucket_per_step(tmp_path):
    spec = dp.TrainSpec(steps=2, momentum=0.9)  # no cap: one bucket per parameter tensor
    runs = dp.train(spec, 2)
    trace = dp.training_trace(runs, tmp_path / "dp.json")
    with open(tmp_path / "dp.json") as f:
        assert json.load(f) == json.loads(json.dumps(trace))
    assert {e["pid"] for e in _spans(trace)} == {0, 1}
    sizes = spec.sizes  # Linear(a, b): a weight of a x b and a bias of b, float32
    tensor_bytes = sorted(n * 4 for a, b in zip(sizes, sizes[1:]) for n in (a * b, b))
    for rank in (0, 1):
        reduces = [e for e in _spans(trace, rank, "communication")
                   if e["args"].get("op") == "all_reduce"]
        for step in (1, 2):
            mine = [e for e in reduces if e["args"]["step"] == step]
            assert sorted(e["args"]["bucket"] for e in mine) == list(range(len(tensor_bytes)))
            assert sorted(e["args"]["bytes"] for e in mine) == tensor_bytes
            compute = Counter(e["name"].split()[0] for e in _spans(trace, rank, "compute")
                              if e["args"]["step"] == step)
            per_rank = spec.micro_batches // 2
            assert compute == {"forward": per_rank, "backward": per_rank, "optimizer": 1}
    one_bucket = dp.training_trace(dp.train(spec.replace(steps=1, bucket_cap_bytes=10**6), 2))
    reduces = [e for e in _spans(one_bucket, 0, "communication")
               if e["args"].get("op") == "all_reduce"]
    assert [e["args"]["bytes"] for e in reduces] == [sum(tensor_bytes)]


# --------------------------------------------------------------------------- the recorder


def test_span_records_only_inside_recording():
    with span("nothing", "compute") as handle:
        assert handle is None  # off: nothing is timed or kept
    with recording(step=3) as outer:
        with span("a", "communication", op="send", peer=1, bytes=8):
            pass
        with recording(stage=1) as inner:
            with span("b"):
                pass
        with span("c"):
            pass
    # nested: the inner recording gets its block's spans, the outer one gets them too
    assert [s.name for s in outer.spans] == ["a", "b", "c"]
    assert [s.name for s in inner.spans] == ["b"]
    a, b, c = outer.spans
    assert a.args == {"step": 3, "op": "send", "peer": 1, "bytes": 8} and a.dur_ns >= 0
    assert b is inner.spans[0] and b.args == {"step": 3, "stage": 1} and c.args == {"step": 3}
    assert c.start_ns >= b.end_ns >= b.start_ns >= a.end_ns


# --------------------------------------------------------------------------- bad input


def test_bad_paths_and_arguments_are_clear_errors(book_run, tmp_path):
    one = [[Span("x", "compute", 0, 1)]]
    with pytest.raises(ValueError, match=r"must end in \.json or \.json\.gz.*trace\.txt'"):
        book_run.chrome_trace(tmp_path / "trace.txt")
    with pytest.raises(TypeError, match="path must be a str or os.PathLike.*got int"):
        chrome_trace(one, path=3)
    with pytest.raises(ValueError, match="the folder .*missing.* does not exist"):
        chrome_trace(one, path=tmp_path / "missing" / "t.json")
    with pytest.raises(ValueError, match="no spans to export"):
        chrome_trace([[], []])
    with pytest.raises(TypeError, match=r"spans_by_rank\[1\] must be a list of parlab.launch.Span"):
        chrome_trace([[], ["F0"]])
    with pytest.raises(ValueError, match=r"names must be one string per rank \(1\)"):
        chrome_trace(one, names=["A1", "A2"])
    with pytest.raises(TypeError, match="runs must be the list of RankRun"):
        dp.training_trace("runs")
    with pytest.raises(ValueError, match=r"cat must be one of \('compute', 'communication'\), "
                                         r"got 'gpu'"):
        with recording():
            span("x", "gpu")
    (tmp_path / "other.json").write_text('{"rows": []}')
    with pytest.raises(ValueError, match="is not a Chrome trace"):
        load_trace(tmp_path / "other.json")
    assert not list(tmp_path.glob("trace*"))
