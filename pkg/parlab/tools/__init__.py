"""The maintainers' command-line tools; readers and the chapters never import them.

    python -m parlab.tools.book build|check|html ...   the chapters' pairs and the book site
    python -m parlab.tools.figures [--list] [NAME ...]  regenerate figures/*.png

Nothing is imported here, so ``import parlab.tools`` stays light: each tool imports its
heavy dependencies (jupytext, nbclient, Sphinx, matplotlib) when it runs. Import a tool's
module itself, e.g. ``from parlab.tools import book``.
"""

__all__ = []
