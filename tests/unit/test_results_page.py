"""The results page, its plots and the README's headline table are what ``benchmarks/render.py`` makes of the
stored results (``benchmarks/results/*.json``): rendered in memory and compared with the files, so a figure is
changed in the data, never by hand. And the headline's spread is computed, not copied: checked by hand here."""

from __future__ import annotations

import importlib.util
import json

from .test_docs import ROOT

spec = importlib.util.spec_from_file_location("render", ROOT / "benchmarks" / "render.py")
render = importlib.util.module_from_spec(spec)
spec.loader.exec_module(render)


def test_the_page_the_plots_and_the_readme_are_up_to_date_with_the_data():
    stale = [
        str(path.relative_to(ROOT))
        for path, text in render.outputs(render.load()).items()
        if not path.exists() or path.read_text() != text
    ]
    assert not stale, f"out of date with benchmarks/results/ (run python benchmarks/render.py): {stale}"


def test_every_plot_the_page_shows_exists_and_every_workload_has_its_section():
    page = render.PAGE.read_text()
    for w in render.load():
        assert f"## {w['workload']}" in page
        for c in w["curves"]:
            assert f"(img/{render.curve_name(w, c)})" in page and (render.IMG / render.curve_name(w, c)).exists()


def test_a_headline_figure_carries_its_runs_median_and_range():
    """atari_pong's time to +15: 477, 561, 614 and 1,133 s; the median of four is the mean of the middle two."""
    pong = json.loads((render.RESULTS / "atari_pong.json").read_text())
    seconds = [r["seconds"] for r in pong["tables"][0]["rows"]]
    assert seconds == [477, 561, 614, 1133]
    assert render.spread(seconds, "s") == "median 587.5 s of 4 runs: 477, 561, 614, 1,133 s (range 477-1,133)"
    assert render.spread([189], "s") == "189 s (1 run)"
    readme = render.README.read_text()
    assert "median 587.5 s of 4 runs" in readme and len(readme.splitlines()) < 200
