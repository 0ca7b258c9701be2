"""GPU names, servers, rails and link types of a rail-optimized cluster (Figure 8-19)."""
import pytest

from parlab.comm import topology
from parlab.comm import LinkSpec, figure_8_19, gpu_name, link_type, nic, rail_optimized, rank_of


def test_figure_8_19_names_and_links():
    top = figure_8_19()
    assert top.names() == ["A1", "B1", "A2", "B2", "A3", "B3"]
    # A_i and B_i share server i (NVLink); A1, A2, A3 share rail switch 1
    assert top.link_type("A1", "B1") == "nvlink" and top.link_type("B3", "A3") == "nvlink"
    assert top.link_type("A1", "A2") == "rail" and top.link_type("B1", "B3") == "rail"
    assert top.link_type("A1", "B2") == "spine"
    assert [top.rail(r) for r in range(6)] == [1, 2, 1, 2, 1, 2]
    assert [top.server(r) for r in range(6)] == [1, 1, 2, 2, 3, 3]


def test_routes_between_rails():
    top = figure_8_19()  # A1 = 0, B1 = 1, A2 = 2, B2 = 3
    assert top.route("A1", "B2") == [(0, 3, "spine")]
    assert top.route("A1", "B2", via="relay") == [(0, 1, "nvlink"), (1, 3, "rail")]
    for via in ("spine", "relay"):  # one way only along a rail or inside a server
        assert top.route("A1", "A2", via) == [(0, 2, "rail")]
        assert top.route("B1", "A1", via) == [(1, 0, "nvlink")]
    # 8 GPUs a server: D1 (rank 3) to E2 (rank 12) relays through E1 (rank 4)
    assert rail_optimized(2).route(3, 12, "relay") == [(3, 4, "nvlink"), (4, 12, "rail")]
    with pytest.raises(ValueError, match="via must be one of"):
        top.route(0, 3, via="pxn")


def test_names_of_eight_gpu_servers_round_trip():
    assert [gpu_name(r) for r in (0, 7, 8, 15)] == ["A1", "H1", "A2", "H2"]
    assert all(rank_of(gpu_name(r)) == r for r in range(64))
    assert [link_type(0, 7), link_type(3, 11), link_type(3, 12)] == ["nvlink", "rail", "spine"]


def test_link_numbers():
    assert nic(400).bandwidth == 50e9 and nic(100).bandwidth == 12.5e9
    assert topology.NVLINK.bandwidth == 450e9
    assert nic(200, "spine").alpha > nic(200, "rail").alpha
    assert LinkSpec("x", 1e-6, 1e9).time(1e9) == pytest.approx(1.000001)
    slower = rail_optimized(2, 8).with_nic(100)
    assert slower.links["rail"].bandwidth == 12.5e9 and slower.links["nvlink"] == topology.NVLINK
    assert str(figure_8_19(200)) == ("3 servers x 2 GPUs, rail-optimized, NVLink 450 GB/s, "
                                     "NICs 200 Gb/s")


@pytest.mark.parametrize("call, match", [
    (lambda: rank_of("Z1", 8), "not a GPU name for servers of 8 GPUs"),
    (lambda: rank_of("A0", 8), "server number from 1"),
    (lambda: gpu_name(0, 27), "from 1 to 26"),
    (lambda: gpu_name(-1), "non-negative"),
    (lambda: link_type("A1", "A1"), "does not send to itself"),
    (lambda: figure_8_19().link_type(0, 6), "not in this topology of 6 GPUs"),
    (lambda: nic(0), "positive speed"),
    (lambda: rail_optimized(0), "servers must be a positive integer .*got 0"),
])
def test_bad_arguments_say_what_is_valid(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_two_gpus_each_use_all_of_their_own_nic_only_across_servers():
    from parlab.experiments import two_gpu_links
    links = two_gpu_links(1e9, nic_gbps=400).set_index("pair")
    assert list(links["link"]) == ["nvlink", "rail", "spine"]
    # a ring of two: 2 steps, each GPU sends half of the 1 GB in each while receiving half
    assert links.loc["A1-B1", "bytes through each NIC"] == 0
    assert links.loc["A1-A2", "bytes through each NIC"] == 1e9
    assert links.loc["A1-B1", "all-reduce (ms)"] == pytest.approx(2 * (1e-6 + 0.5 / 450) * 1e3,
                                                                 abs=0.01)
    assert links.loc["A1-A2", "all-reduce (ms)"] == pytest.approx(2 * (2e-6 + 0.5 / 50) * 1e3,
                                                                 abs=0.01)
    assert links.loc["A1-B2", "GB/s each way"] == 50
    assert links.loc["A1-A2", "port busy (%)"] == pytest.approx(100 * 0.02 / 0.020004, abs=0.1)
