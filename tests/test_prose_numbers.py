"""No quantity in a chapter's prose is typed by hand: it is glued from the code.

A *quantity* is a number with a unit (B, GB, %, x, s, hours, GPUs, steps, messages, ...)
in a markdown cell, outside a glue span (``<span data-glue="name">...</span>``), code and
maths. The test fails on any such quantity unless its sentence attributes it to a source
(the book, a paper, the slides, a datasheet, a default), it is an exercise's given, or it
is one of the few listed below with the reason it stays typed.

To glue a number: in the hidden glue cell right after the reader's cell that computes it
(``# %% tags=["remove-cell"] jupyter={"source_hidden": true, "outputs_hidden": true}``,
never the reader's own cell), call ``glue("name", value, fmt)``, and write
``<span data-glue="name">text</span>`` in the prose (see :mod:`parlab.viz.glue`). The glued
values themselves are checked against their records by ``tests/test_site.py`` and nbval.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"

UNITS = (r"(?:[KMGT]i?B|bytes?|B|%|×|x|s|ms|µs|seconds?|minutes?|hours?|h|days?|k?W|MWh?|"
         r"kWh|[GT]b/s|GB/s|TFLOP/s|FLOPs?|M|billion|million|GPUs?|ranks?|steps?|messages?|"
         r"times|tokens?|sequences?)")
QUANTITY = re.compile(r"(?<![\w.\-/])(\d[\d,]*(?:\.\d+)?)\s?" + UNITS + r"(?![\w/])")
#: a sentence that names where its number comes from keeps it typed
ATTRIBUTED = re.compile(r"\bbook|\bpaper|\bslides?\b|datasheet|NCCL|\bdefault|Korthikanti|"
                        r"Rajbhandari|Goyal|Young's|\bthe chapter\b(?! \d)|\bquoted", re.I)
#: names that carry digits: GPT-3 175B, Llama-3-8B, Mistral-7B, H100, fp32, 8-14 ...
NAMES = re.compile(r"\b(?:GPT-\d+|Llama-[\d.]+|Mistral)[- ][\w.]+|\b[A-Z]+\d+\b|\bfp\d+|bf16")

#: quantities that stay typed, per chapter, each with its reason
TYPED = {
    "00": {},
    "01": {"80 GB": "the GPU the chapter sizes against, a given like the model's name",
           "50,000 GPUs": "the book's example run, introduced as the book's",
           "175 billion": "GPT-3's size as its name and the book give it"},
    "02": {},
    "03": {},
    "04": {"605 M": "the book's number, named as its slip in the sentence before"},
    "05": {"5 %": "the slides' claim (90-95 % of compute in 5 % of the parameters)"},
    "06": {},
    "07": {"80 GB": "the GPU the chapter sizes against, a given like the model's name"},
    "08": {},
    "09": {},
}


def quantities(notebook: Path) -> list[tuple[int, str, str]]:
    """(cell index, quantity, sentence) of every typed, unattributed quantity in the prose."""
    cells = json.loads(notebook.read_text())["cells"]
    found = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        text = re.sub(r'<span data-glue="[^"]*">[^<]*</span>', "GLUED", text)
        text = re.sub(r"`[^`]*`|\$[^$]*\$", "CODE", text)
        text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
        text = NAMES.sub("NAME", text)
        text = re.sub(r'"[^"\n]*"|“[^”]*”', "QUOTE", text)  # quoted words are someone else's
        # an exercise's paragraph states its givens
        text = "\n\n".join(p for p in re.split(r"\n\s*\n", text) if "**Exercise" not in p)
        for sentence in re.split(r"(?<=[.;!?])\s+|\n\s*\n|\n\s*(?:[*|-]|\d+\.)\s", text):
            if ATTRIBUTED.search(sentence):
                continue
            for match in QUANTITY.finditer(sentence):
                found.append((index, match.group(0), " ".join(sentence.split())))
    return found


@pytest.mark.parametrize("notebook", sorted(CHAPTERS.glob("0*.ipynb")), ids=lambda p: p.stem)
def test_no_quantity_in_prose_is_typed(notebook):
    allowed = TYPED[notebook.name[:2]]
    typed = [(i, q, s) for i, q, s in quantities(notebook) if q not in allowed]
    assert not typed, "glue these (parlab.viz.glue) or attribute them:\n" + "\n".join(
        f"  cell {i}: {q!r} in: {s[:160]}" for i, q, s in typed)


def test_the_check_catches_a_typed_quantity(tmp_path):
    cells = [{"cell_type": "markdown", "source": text, "metadata": {}} for text in (
        "The ring sends 1.5 × the gradient, 464 B in 3 steps.",
        'The ring sends <span data-glue="r">1.5</span> × the gradient.',
        "The book says 605 M.",
        "GPT-3 175B on H100s in bf16; see Figure 8-14 and chapter 05.",
        "**Exercise 02.1.** Four ranks hold 8 samples.\nOf 32 samples in 2 steps?",
        "After the exercise: 2 steps.")]
    path = tmp_path / "09_probe.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    assert [(i, q) for i, q, _ in quantities(path)] == [(0, "1.5 ×"), (0, "464 B"),
                                                         (0, "3 steps"), (5, "2 steps")]
