"""Progress bars that read right after the run, wherever the notebook is opened.

In a kernel with ipywidgets, tqdm draws a widget. Its plain-text fallback (what GitHub, the
book site, a terminal reading the ``.ipynb``, or a JupyterLab without the live kernel show)
is computed once, when the bar first appears: a finished bar would then be stored as
"0%| | 0/30". :func:`progress_bar` shows the widget under a display id and, when the bar
closes, updates that display, so the stored fallback is the finished state ("100%| 30/30").
Outside a notebook it is plain ``tqdm.auto.tqdm``. Imports nothing of parlab.
"""

from __future__ import annotations

__all__ = ["progress_bar"]


def progress_bar(iterable=None, **options):
    """A ``tqdm.auto`` bar over ``iterable`` (``total=``, ``desc=``, ``unit=``, ``disable=``
    as in tqdm) whose stored text, in a notebook, is its final state."""
    from tqdm.auto import tqdm

    try:
        from tqdm.notebook import tqdm_notebook
    except ImportError:  # no ipywidgets: tqdm.auto is the text bar
        return tqdm(iterable, **options)
    if not (isinstance(tqdm, type) and issubclass(tqdm, tqdm_notebook)):
        return tqdm(iterable, **options)
    return _notebook_bar()(iterable, **options)


def _notebook_bar():
    from IPython.display import display
    from tqdm.notebook import tqdm_notebook

    class NotebookBar(tqdm_notebook):
        """tqdm's widget bar, displayed under an id and re-displayed when it closes."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, display=False, **kwargs)
            self._handle = None
            if not self.disable:
                self._handle = display(self.container, display_id=True)
                self.displayed = True

        def close(self):
            super().close()
            handle, self._handle = getattr(self, "_handle", None), None
            if handle is not None:
                handle.update(self.container)  # the fallback text now says the final state

    return NotebookBar
