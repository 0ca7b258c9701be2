"""parlab: the runnable companion to "Parallelism Strategies in Deep Learning"."""
__version__ = "0.1.0"
