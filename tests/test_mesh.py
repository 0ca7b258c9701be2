"""parlab.comm.Mesh: the rank grid every hybrid run uses, against an independent reference.

The reference is torch's own arithmetic: ``torch.arange(dp * pp * tp).view(dp, pp, tp)`` puts
rank ``(replica * pp + stage) * tp + tensor`` at index (replica, stage, tensor), and a group
of one kind is a line of that array along one axis (as in a DeviceMesh with dims dp, pp, tp).
"""
import itertools

import pytest
import torch
import torch.distributed as dist

from parlab.comm import GROUP_KINDS, Mesh
from parlab.launch import run

SHAPES = [(1, 1, 1), (2, 2, 2), (3, 1, 2), (2, 4, 1), (1, 3, 4), (4, 2, 2)]


@pytest.mark.parametrize("dp,pp,tp", SHAPES)
def test_coordinates_and_groups_match_a_reshaped_arange(dp, pp, tp):
    mesh, grid = Mesh(dp=dp, pp=pp, tp=tp), torch.arange(dp * pp * tp).view(dp, pp, tp)
    for d, k, t in itertools.product(range(dp), range(pp), range(tp)):
        rank = int(grid[d, k, t])
        assert mesh.rank_at(d, k, t) == rank
        assert tuple(mesh.coordinates(rank)) == (d, k, t)
    axis = {"data": 0, "pipeline": 1, "tensor": 2}
    for kind in GROUP_KINDS:
        lines = grid.movedim(axis[kind], -1).reshape(-1, grid.shape[axis[kind]]).tolist()
        assert sorted(mesh.group_ranks(kind)) == sorted(lines), kind
        # every rank sits in exactly one group of each kind
        assert sorted(r for g in mesh.group_ranks(kind) for r in g) == list(range(mesh.size))


def test_bad_meshes_are_clear_errors():
    with pytest.raises(ValueError, match="tp must be a positive integer, got 0"):
        Mesh(tp=0)
    with pytest.raises(ValueError, match="rank must be in 0..7"):
        Mesh(dp=2, pp=2, tp=2).coordinates(8)
    with pytest.raises(ValueError, match="stage must be in 0..1"):
        Mesh(dp=2, pp=2, tp=2).rank_at(0, 2, 0)
    with pytest.raises(ValueError, match="unknown group kind 'expert'"):
        Mesh().group_ranks("expert")


@pytest.mark.parametrize("dp,pp,cp,tp", [(2, 1, 2, 2), (1, 2, 3, 1), (2, 2, 2, 1)])
def test_context_dimension_sits_between_stage_and_tensor(dp, pp, cp, tp):
    mesh, grid = Mesh(dp=dp, pp=pp, tp=tp, cp=cp), torch.arange(dp * pp * cp * tp).view(
        dp, pp, cp, tp)
    for d, k, c, t in itertools.product(range(dp), range(pp), range(cp), range(tp)):
        rank = int(grid[d, k, c, t])
        assert mesh.rank_at(d, k, t, c) == rank
        assert tuple(mesh.coordinates(rank)) == (d, k, t) and mesh.context_of(rank) == c
    axis = {"data": 0, "pipeline": 1, "context": 2, "tensor": 3}
    for kind, a in axis.items():
        lines = grid.movedim(a, -1).reshape(-1, grid.shape[a]).tolist()
        assert sorted(mesh.group_ranks(kind)) == sorted(lines), kind


def _my_groups(dp, pp, tp, label):
    mesh = Mesh(dp=dp, pp=pp, tp=tp)
    device_mesh = mesh.build(label=(lambda kind, first: f"{kind} {first.stage}") if label
                             else None)
    groups = mesh.groups(device_mesh)
    for kind in ("tensor", "data"):  # a real collective on two kinds of group
        dist.all_reduce(torch.ones(1), group=groups[kind])
    return ({kind: dist.get_process_group_ranks(g) for kind, g in groups.items()},
            device_mesh.mesh_dim_names, device_mesh["tp"].size(), device_mesh.get_coordinate())


@pytest.mark.parametrize("backend", ["toy", "gloo"])
def test_build_makes_a_device_mesh_whose_groups_are_this_ranks_lines(backend):
    dp, pp, tp = 2, 1, 2
    results = run(_my_groups, 4, dp, pp, tp, backend == "toy", backend=backend)
    mesh = Mesh(dp=dp, pp=pp, tp=tp)
    for rank, (groups, names, tp_size, where) in enumerate(results):
        assert names == ("dp", "pp", "cp", "tp") and tp_size == tp
        d, k, t = mesh.coordinates(rank)
        assert list(where) == [d, k, 0, t]
        for kind, members in groups.items():
            assert rank in members and members in mesh.group_ranks(kind)
    if backend == "toy":  # each group's messages carry its label in the traffic log
        log = results.traffic
        assert {r.group for r in log.filter(op="all_reduce").records} == {"tensor 0", "data 0"}


def test_build_refuses_a_world_of_another_size():
    with pytest.raises(Exception, match="needs 8 ranks, the world has 2"):
        run(lambda: Mesh(dp=2, pp=2, tp=2).build(), 2, backend="gloo")
