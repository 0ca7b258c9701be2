"""figures/ is current: every registered figure, rendered once, matches its committed PNG.

``python -m parlab.tools.figures`` writes ``figures/<name>.png`` for every figure the
chapter code registers. A change to a drawing or to the numbers behind it must come with
its regenerated PNG, or this test fails and names the command that refreshes it.

Why a comparison by pixels, and this tolerance: rendering is deterministic here (Agg, a fixed
dpi, no text chunk carrying a version or a date): two renderings on one machine are the same
bytes, so their RMS difference is 0. A real change is far above ``TOL``: measured with
:func:`~matplotlib.testing.compare.compare_images` (RMS over every pixel, 0-255), one letter
of a title changed gives 1.7 to 12 (the centred title moves), one digit of a label 0.6 to 2.5
(0.6 on the largest figures, where a local change is averaged over the most pixels), a figure
whose size changes fails outright. ``TOL`` = 0.1 sits well below the smallest of those and
above the 0 of a rerun, so it only absorbs a stray anti-aliased pixel or two, never a
changed word or number.

No registered figure is drawn from wall-clock times (the trace timelines of
:mod:`parlab.viz.plots.timeline` are drawn in the chapters, not registered); one that is
belongs in ``MEASURED`` with its reason, and is then checked for existence only.

Rendering every figure takes about 20 s (it launches real ranks), so it happens once, in a
module fixture, and every check reads that one rendering.
"""
from pathlib import Path

import pytest

from parlab.tools import figures

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "figures"
#: Average pixel difference (RMS, 0-255) a figure may show and still count as the same.
TOL = 0.1
#: Committed PNGs that are not registered figures, with the reason.
NOT_FIGURES = {"jupyterlab-pipeline-explorer.png": "a screenshot from tests/browser"}
#: Registered figures drawn from measured times, which no two runs draw alike: name -> reason.
MEASURED: dict[str, str] = {}

REFRESH = "run `python -m parlab.tools.figures {name}` and commit figures/{name}.png"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """{name: path} of every registered figure, rendered once into a temporary folder."""
    out = tmp_path_factory.mktemp("figures")
    names = [n for n in figures.registry() if n not in MEASURED]
    return dict(zip(names, figures.render(names, out, progress=False)))


def test_every_registered_figure_has_a_committed_png():
    missing = [n for n in figures.registry() if not (COMMITTED / f"{n}.png").is_file()]
    assert missing == [], "no committed PNG for " + ", ".join(missing) + ": " + \
        "; ".join(REFRESH.format(name=n) for n in missing)


def test_every_committed_png_is_a_registered_figure():
    registered = set(figures.registry())
    orphans = sorted(p.name for p in COMMITTED.glob("*.png")
                     if p.stem not in registered and p.name not in NOT_FIGURES)
    assert orphans == [], (f"figures/ holds {orphans}, which no plot module registers: delete "
                           f"them (git rm) or register them with parlab.viz.registry.figure")


def test_no_figure_of_measured_times_is_compared_by_pixels():
    timeline = [n for n, (_, make) in figures.registry().items()
                if make.__module__.endswith(".timeline") and n not in MEASURED]
    assert timeline == [], (f"{timeline} draw measured spans, which differ on every run: list "
                            f"them in MEASURED with the reason and compare their data instead")


def test_every_figure_matches_its_committed_png(rendered):
    from matplotlib.testing.compare import compare_images
    from matplotlib.testing.exceptions import ImageComparisonFailure

    stale = []
    for name, fresh in rendered.items():
        committed = COMMITTED / f"{name}.png"
        if not committed.is_file():
            continue  # test_every_registered_figure_has_a_committed_png names it
        try:
            diff = compare_images(str(committed), str(fresh), tol=TOL, in_decorator=True)
        except ImageComparisonFailure as exc:  # a different size: the picture changed
            stale.append(f"{name}: {' '.join(str(exc).split())}")
            continue
        if diff is not None:
            stale.append(f"{name}: RMS {diff['rms']:.2f} > {TOL} (difference: {diff['diff']})")
    names = " ".join(s.split(":")[0] for s in stale)
    assert stale == [], ("these figures differ from their PNG in figures/:\n  "
                         + "\n  ".join(stale)
                         + f"\nrun `python -m parlab.tools.figures {names}` and commit the PNGs")
