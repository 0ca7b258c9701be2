"""parlab: the runnable companion to "Parallelism Strategies in Deep Learning".

The subpackages, bottom up (each imports only those before it): ``launch`` (start ranks),
``comm`` (the toy backend, traffic, collective costs, topology, the rank mesh), ``models``,
``memory``, ``data_parallel``, ``pipeline``, ``tensor_parallel``, ``hybrid``, ``viz`` (draws
only) and ``exercises``. ``book`` and ``figures`` are the maintainers' command-line tools;
``units`` formats bytes for every printed number; ``progress`` draws progress bars.
"""

__version__ = "0.1.0"

from parlab.comm import toy as _toy

_toy.register()  # backend "toy" for torch.distributed, in every process that imports parlab
