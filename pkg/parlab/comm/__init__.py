"""Communication: the toy backend, the traffic it logs, what collectives cost, and the cluster.

Everything the chapters say about bytes on wires lives here: ``toy`` (the logged backend),
``traffic`` (a run's merged log and its time on a topology), ``cost`` (every collective's
closed form, one formula each), ``topology`` (GPU names, NVLink, rails and the spine),
``mesh`` (the data x pipeline x tensor rank grid and its process groups, used by every hybrid
run, and ``default_mesh``, every rank on one dimension), ``all_to_all`` (the all-to-all that autograd goes through, for experts and Ulysses), ``collectives`` (chapter 00's checked collectives) and ``trace`` (all ranks' spans, as
:mod:`parlab.launch` records them, as a Chrome trace for Perfetto). Imports only
:mod:`parlab.launch`.
"""

from parlab.comm.traffic import TrafficLog, Transfer
from parlab.comm.cost import (
    ALGORITHMS, allreduce_bytes_per_rank, allreduce_steps, allreduce_time, bus_bandwidth,
    ring_wire_bytes
)
from parlab.comm.topology import (
    LINK_TYPES, NETWORK_SWITCHES, NVLINK, figure_8_19, gpu_name, link_type, LinkSpec, nic,
    rail_optimized, rank_of, ROUTES, Topology
)
from parlab.comm.mesh import GROUP_KINDS, Coordinates, default_mesh, Mesh
from parlab.comm.collectives import COLLECTIVES, one_collective
from parlab.comm.all_to_all import all_to_all
from parlab.comm import toy
from parlab.comm.toy import run_with_traffic
from parlab.comm.trace import chrome_trace, load_trace, trace_summary

__all__ = ["Transfer", "TrafficLog", "ALGORITHMS", "ring_wire_bytes", "allreduce_bytes_per_rank",
           "allreduce_steps", "allreduce_time", "bus_bandwidth", "LinkSpec", "NVLINK", "nic",
           "Topology", "rail_optimized", "figure_8_19", "gpu_name", "rank_of", "link_type",
           "LINK_TYPES", "ROUTES", "NETWORK_SWITCHES", "Mesh", "Coordinates", "GROUP_KINDS",
           "default_mesh",
           "COLLECTIVES", "one_collective", "all_to_all",
           "toy", "run_with_traffic", "chrome_trace", "load_trace", "trace_summary"]
