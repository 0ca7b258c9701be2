"""What DTensor's collectives were, as PyTorch's ``CommDebugMode`` sees them, with their bytes.

A face of its own, as in PyTorch (``torch.distributed.tensor.debug``): importing that module
takes about a second and a half, so :mod:`parlab.tensor_parallel` does not, and a chapter
that never counts DTensor's collectives does not pay for it.
"""

from parlab.tensor_parallel.debug.comm_bytes import CommBytes

__all__ = ["CommBytes"]
