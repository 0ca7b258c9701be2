"""The explorer pattern every widget follows, made by :func:`explore`:

1. the figure at the default setting is shown as an ordinary output, so the notebook reads
   well where widgets do not render (GitHub, the HTML edition, a reader without a kernel);
   where the chapter's cell above has just shown that very figure, nothing is drawn again
   (``shown_above``): the page does not show it twice, nor the run behind it cost twice;
2. below it, the controls and a live output that redraws when a control moves.

The widget's plain-text face is a fixed sentence (:class:`Explorer`): nbval compares
``text/plain`` outputs, and a widget's default repr embeds its current state, which would
make stored outputs depend on the machine.
"""

from __future__ import annotations

import threading
from typing import Callable

__all__ = ["Explorer", "explore"]

#: One redraw at a time: pyplot's state is global, and two overlapping redraws (a fast
#: slider sends several changes) must not interleave.
_DRAWING = threading.Lock()


def _png(fig):
    """The figure as a PNG image, rendered here rather than by the display hook."""
    from IPython.display import Image

    from parlab.viz.style import png

    return Image(data=png(fig), format="png")


class Explorer:
    """A widget with a fixed plain-text representation (what nbval and text readers see).

    ``controls`` maps each argument of the drawing function to its control, so a chapter can
    quote a control's default or range (``explorer.controls["ranks"].max``).
    """

    def __init__(self, widget, description: str, controls: dict | None = None):
        self.widget = widget
        self.description = description
        self.controls = dict(controls or {})

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs) or {}
        if isinstance(bundle, tuple):  # (data, metadata) form
            bundle = bundle[0]
        bundle = dict(bundle)
        bundle["text/plain"] = f"[interactive] {self.description}"
        return bundle

    def __repr__(self) -> str:
        return f"[interactive] {self.description}"


def explore(draw: Callable, controls: dict, description: str, static: bool = True,
            shown_above: bool = False) -> Explorer:
    """Show ``draw(**defaults)`` as a static figure, then return a live explorer.

    ``draw`` takes the controls' values as keyword arguments and returns a matplotlib
    Figure (or None after printing text). ``controls`` maps argument names to ipywidgets
    (sliders, dropdowns, ...); their initial values are the defaults. ``shown_above``: the
    page has just shown ``draw(**defaults)``'s output, so nothing is drawn until a control
    moves, and the live output says where the default view is.
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    from parlab.viz.style import show

    def render(out):
        values = {name: control.value for name, control in controls.items()}
        # interactive mode off while the figure is built: outside a cell's execution,
        # pyplot's auto-draw fires on every change of a half-built figure, and the first
        # render of the finished one came out blank in JupyterLab
        with _DRAWING, plt.ioff(), out:
            out.clear_output(wait=True)
            result = draw(**values)
            if result is not None:
                display(_png(result))
                plt.close(result)

    out = w.Output()
    if shown_above:
        out.append_stdout("This explorer's settings are those of the output above: move a "
                          "control to redraw it here.\n")
    elif static:
        fig = draw(**{name: control.value for name, control in controls.items()})
        if fig is not None:
            show(fig)
    for control in controls.values():
        control.observe(lambda change: render(out), names="value")
    if not (static or shown_above):
        render(out)
    box = w.VBox([w.HBox(list(controls.values()), layout=w.Layout(flex_flow="row wrap")), out])
    return Explorer(box, description, controls)
