"""What a failed launch raises: the rank that failed, its exception and traceback, or a timeout.

Why a module of its own: both the local launcher and the torchrun path raise these, and a
reader catches them (``except RankError as err: err.rank_traceback``) without needing
anything else of the launcher.
"""

from __future__ import annotations

__all__ = ["RankError", "RankTimeoutError"]


class RankError(RuntimeError):
    """A rank raised, died, or (as :class:`RankTimeoutError`) did not finish in time.

    Attributes: ``rank`` (the first rank that failed, or None for a timeout),
    ``exc_type`` (the name of the exception it raised), ``rank_traceback`` (its traceback as
    text) and ``outputs`` (each rank's captured stdout/stderr).
    """

    def __init__(self, message, rank=None, exc_type=None, rank_traceback="", outputs=None):
        super().__init__(message)
        self.rank = rank
        self.exc_type = exc_type
        self.rank_traceback = rank_traceback
        self.outputs = outputs or []


class RankTimeoutError(RankError, TimeoutError):
    """Some ranks were still running when the launch's ``timeout`` ran out."""

    def __init__(self, message, pending, outputs=None):
        super().__init__(message, outputs=outputs)
        self.pending = pending

