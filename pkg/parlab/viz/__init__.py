"""Pictures and controls: the plots and the explorers. This layer draws only; it never computes.

``style`` (one colour per GPU and rank; ``show`` a figure once, drawn once by ``png``),
``registry`` (every figure under the book's numbering; the recipes that run and then draw
are registered by
:mod:`parlab.experiments`), ``explorer`` (the widget pattern), ``glue`` (numbers for the
prose), ``plots`` (one module of drawings per chapter), ``widgets`` (one module of explorers
per chapter). Imports any subpackage below it but nothing that starts ranks (the
architecture test checks); nothing below imports it.
"""

from parlab.viz.style import png, show
from parlab.viz.registry import figure, registered
from parlab.viz.explorer import explore, Explorer
from parlab.viz.glue import glue

__all__ = ["show", "png", "figure", "registered", "Explorer", "explore", "glue"]
