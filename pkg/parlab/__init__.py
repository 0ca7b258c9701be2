"""parlab: the runnable companion to "Parallelism Strategies in Deep Learning"."""
__version__ = "0.1.0"

from . import toy_backend as _toy_backend  # registers backend "toy" with torch.distributed

_toy_backend.register()
