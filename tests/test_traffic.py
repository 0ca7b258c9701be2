"""Traffic volumes against the textbook formulas, the tables, and the alpha-beta model by hand."""
import pytest
import torch
import torch.distributed as dist

from parlab.comm import ALGORITHMS

from parlab.comm.toy import backend as toy_backend
from parlab.comm import figure_8_19, rail_optimized, traffic
from parlab.comm import (
    Transfer, TrafficLog, allreduce_bytes_per_rank, allreduce_steps, allreduce_time, bus_bandwidth,
    run_with_traffic
)


def _all_reduce_each_algorithm(numel):
    for name in ALGORITHMS:
        with toy_backend.algorithm(name):
            dist.all_reduce(torch.ones(numel))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_logged_all_reduce_volumes_equal_the_formulas(n):
    numel = 6 * n  # n divides the tensor: the ring's 2(n-1)/n is exact
    nbytes = 4 * numel
    _, log = run_with_traffic(_all_reduce_each_algorithm, n, numel)
    for algorithm in ALGORITHMS:
        part = log.filter(algorithm=algorithm)
        sent = part.per_rank()["sent"].tolist()
        assert sent == allreduce_bytes_per_rank(nbytes, n, algorithm), algorithm
        assert part.per_step()["step"].nunique() == allreduce_steps(n, algorithm)
        # on a uniform network the model of the logged steps equals the closed form
        uniform = rail_optimized(n, 1)  # one GPU per server, all on rail 1
        assert part.time(uniform) == pytest.approx(allreduce_time(nbytes, n, algorithm,
                                                                  uniform.links["rail"]))
    ring = log.filter(algorithm="ring").per_rank()
    assert (ring["sent"] == 2 * (n - 1) * nbytes // n).all()
    naive = log.filter(algorithm="naive").per_rank()
    assert naive.loc[0, "sent"] == naive.loc[0, "received"] == (n - 1) * nbytes


def test_uneven_ring_moves_2_n_minus_1_tensors_in_total():
    _, log = run_with_traffic(_all_reduce_each_algorithm, 4, 7)
    ring = log.filter(algorithm="ring")
    assert ring.total_bytes() == 2 * 3 * 7 * 4
    assert sorted(ring.per_rank()["sent"]) == [40, 40, 44, 44]  # chunks of 2, 2, 2, 1 floats


def _two_collectives():
    dist.all_reduce(torch.ones(2))
    dist.broadcast(torch.ones(3), src=1)


def test_tables_of_a_small_run():
    results, log = run_with_traffic(_two_collectives, 2, algorithm="naive")
    assert results == [None, None]
    assert [(r.op, r.step, r.src, r.dst, r.nbytes, r.call) for r in log.records] == [
        ("all_reduce", 0, 1, 0, 8, 0), ("all_reduce", 1, 0, 1, 8, 0), ("broadcast", 0, 1, 0, 12, 1)]
    assert log.total_bytes() == 28 and len(log) == 3
    assert log.per_link().to_dict("list") == {"src": [0, 1], "dst": [1, 0], "bytes": [8, 20],
                                              "messages": [1, 2]}
    assert log.per_step()[["op", "step", "bytes"]].values.tolist() == [
        ["all_reduce", 0, 8], ["all_reduce", 1, 8], ["broadcast", 0, 12]]
    assert log.matrix().tolist() == [[0, 8], [20, 0]]
    assert log.matrix(step=1).tolist() == [[0, 8], [0, 0]]
    assert log.per_link(figure_8_19())["link"].tolist() == ["nvlink", "nvlink"]


def test_each_transfer_is_counted_once_when_logs_merge():
    sent = Transfer("send", "p2p", 0, 0, 1, 10)
    merged = TrafficLog.from_rank_logs([[sent], [sent]])  # rank 1 logged it as received
    assert merged.records == [sent]


def test_the_model_against_a_hand_computation():
    """Figure 8-19 (400 Gb/s NICs = 50e9 B/s, NVLink 450e9 B/s), 1 MB messages."""
    mb = 10**6
    log = TrafficLog([
        # step 0: A1 -> B1 over NVLink and A1 -> A2 through rail switch 1 use different ports
        Transfer("demo", "hand", 0, 0, 1, mb), Transfer("demo", "hand", 0, 0, 2, mb),
        # step 1: A1 sends to A2 and A3 (its NIC carries 2 MB); B1 -> A2 crosses the spine
        # and A2's NIC receives 2 MB (from A1 and from B1)
        Transfer("demo", "hand", 1, 0, 2, mb), Transfer("demo", "hand", 1, 0, 4, mb),
        Transfer("demo", "hand", 1, 1, 2, mb),
    ])
    step0 = max(1e-6 + mb / 450e9, 2e-6 + mb / 50e9)  # = 22 us, the rail message
    step1 = max(2e-6 + 2 * mb / 50e9,                  # A1 -> A2, A1 -> A3: 42 us
                3e-6 + 2 * mb / 50e9)                  # B1 -> A2 via spine: 43 us
    times = log.step_times(figure_8_19())
    assert times["seconds"].tolist() == pytest.approx([step0, step1])
    assert times["seconds"].tolist() == pytest.approx([22e-6, 43e-6])
    assert times["slowest link"].tolist() == ["A1->A2 (rail)", "B1->A2 (spine)"]
    assert log.time(figure_8_19()) == pytest.approx(65e-6)
    assert log.per_link_type(figure_8_19()) == {"nvlink": mb, "rail": 3 * mb, "spine": mb}


def test_closed_forms():
    assert allreduce_bytes_per_rank(100, 4, "ring") == [150.0] * 4
    assert allreduce_bytes_per_rank(100, 4, "naive") == [300, 100, 100, 100]
    assert allreduce_bytes_per_rank(100, 5, "tree") == [300, 100, 200, 100, 100]  # 0:1,2,4; 2:3
    assert [allreduce_steps(8, a) for a in ("ring", "naive", "tree")] == [14, 2, 6]
    link = rail_optimized(1, 1).links["rail"]
    assert allreduce_time(8e6, 4, "ring", link) == pytest.approx(6 * (2e-6 + 2e6 / 50e9))
    assert bus_bandwidth("all_reduce", 1e9, 1.0, 4) == 1.5e9
    assert bus_bandwidth("all_gather", 1e9, 2.0, 4) == 0.375e9
    with pytest.raises(ValueError, match=r"choose one of \['ring', 'naive', 'tree'\]"):
        allreduce_time(1, 2, "butterfly")
    with pytest.raises(ValueError, match="known: "):
        bus_bandwidth("gossip", 1, 1, 2)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown algorithm 'fast'"):
        run_with_traffic(_two_collectives, 2, algorithm="fast")
    with pytest.raises(ValueError, match="unknown field"):
        TrafficLog([]).filter(colour="red")
    assert traffic.TrafficLog([]).total_bytes() == 0


def test_collective_explorer_runs_real_ranks_and_redraws(capsys):
    import matplotlib
    matplotlib.use("Agg")
    from parlab.experiments import collective_explorer

    explorer = collective_explorer()  # all_gather on a ring of 4, 16 floats: the static figure
    out = capsys.readouterr().out
    assert "every rank's result is right: True" in out
    assert "3 steps, 12 messages, 768 B in all" in out  # each rank sends its piece 3 times
    controls = explorer.widget.children[0].children
    collective, algorithm, ranks, floats = controls
    collective.value = "all_reduce"
    ranks.value = 5
    floats.value = 20  # 80 bytes: the ring's 2(n-1)/n = 8/5 of it per rank, exactly
    out = capsys.readouterr().out.split("all_reduce (ring) on 5 ranks")[-1]
    assert "every rank's result is right: True" in out
    assert "8 steps, 40 messages" in out and "the busiest rank sends 128 B" in out
    algorithm.value = "naive"
    assert "rank sends 320 B (4.00 x 80 B)" in capsys.readouterr().out  # root: 4 sums back
    assert repr(explorer).startswith("[interactive]")


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "broadcast"])
def test_every_explored_collective_is_right_with_every_algorithm(collective, capsys):
    import matplotlib
    import matplotlib.pyplot as plt
    matplotlib.use("Agg")
    from parlab.experiments import draw_collective

    for algorithm in ALGORITHMS:
        plt.close(draw_collective(collective, algorithm, ranks=3, elements=4))
        assert "every rank's result is right: True" in capsys.readouterr().out, algorithm
    with pytest.raises(ValueError, match="unknown collective 'gossip'; choose one of"):
        draw_collective("gossip")
