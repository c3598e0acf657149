"""Renders every table and plot of the results page, and the README's headline table, from the stored results.

    python benchmarks/render.py            # writes docs/results.md, docs/img/results_*.svg, README.md's headline
    python benchmarks/render.py --check    # exit 1 when a written file differs from what the data gives
    python benchmarks/render.py --add_run TRAIN_DIR/EXPERIMENT --to cartpole --curve ID --system msf --seed 0

The results are data: one JSON file per workload in ``benchmarks/results/`` (``<workload>.json``), each with

* ``workload``, ``anchor`` (the page's section id), ``about`` (what is measured, with which settings);
* ``headline``: a list; each names the table and field of one row of the headline table (``table``, ``field``,
  ``unit``, ``measure``, ``peer``: the peer beside msf, ``peer_note``: said when the peer has no run,
  ``filter``: a text the rows' ``system`` must hold);
* ``tables``: each with ``id``, ``title``, ``date``, ``machine``, ``command`` (what reproduces it), ``note``,
  ``columns`` (``[key, header]`` pairs), ``rows`` (one dict per run or stage), and ``summarise``: the fields whose
  runs are summed up per system (every run, the median, the range and the count of runs);
* ``curves``: each with ``id``, ``title``, ``date``, ``machine``, ``command``, ``x`` (the x-axis: ``frames`` or
  ``env steps``) and ``series`` (``system``, ``seed``, ``points``: ``[x, mean return]`` or ``[x, mean return,
  seconds since the start]``). A curve whose every series has seconds is drawn against wall time too.

A page is never edited by hand to change a figure: change or add the data (a benchmark's output, or
``--add_run`` for a run's TensorBoard curve), then run this script. ``tests/unit/test_results_page.py`` renders the
page in memory and compares it with the files. Every figure is what a run printed or logged; none is estimated.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "results.md"
IMG = ROOT / "docs" / "img"
README = ROOT / "README.md"
BEGIN, END = "<!-- results:headline (python benchmarks/render.py) -->", "<!-- /results:headline -->"
ORDER = ("cartpole", "atari_pong", "doom_basic", "mujoco")


def load() -> list[dict]:
    """The workloads' results, in the page's order (then any other file, by name)."""
    files = sorted(RESULTS.glob("*.json"), key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER else 99, p.stem))
    return [dict(json.loads(p.read_text()), file=p.stem) for p in files]


def fmt(v) -> str:
    """A figure as the tables write it: thousands separated; floats under 10 to 3 significant digits (ratios,
    microseconds), under 1,000 to one decimal, whole above."""
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 10 else f"{v:,.1f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def spread(values: list, unit: str = "") -> str:
    """``median M u of N runs: a, b, c u (range lo-hi)``, or the one run's figure; runs in the data's order."""
    u = f" {unit}" if unit else ""
    if len(values) == 1:
        return f"{fmt(values[0])}{u} (1 run)"
    med = statistics.median(values)
    med = int(med) if float(med).is_integer() and all(isinstance(v, int) for v in values) else med
    runs = ", ".join(fmt(v) for v in values)
    return f"median {fmt(med)}{u} of {len(values)} runs: {runs}{u} (range {fmt(min(values))}-{fmt(max(values))})"


def _systems(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["system"] for r in rows if "system" in r))


def _values(rows: list[dict], system_prefix: str, field: str, must_hold: str = "") -> list:
    return [r[field] for r in rows if r.get("system", "").startswith(system_prefix) and must_hold in r["system"]]


def headline_rows(workloads: list[dict]) -> list[str]:
    """The headline table: one row per workload, msf beside its peer, each with its runs' spread."""
    out = ["| workload | measure | msf | beside it | date |", "|---|---|---|---|---|"]
    machines: dict[str, None] = {}
    for w in workloads:
        for h in w["headline"]:
            table = next(t for t in w["tables"] if t["id"] == h["table"])
            must = h.get("filter", "")
            ours = _values(table["rows"], "msf", h["field"], must)
            theirs = _values(table["rows"], h["peer"], h["field"], must)
            peer = spread(theirs, h["unit"]) if theirs else h.get("peer_note", "not run")
            link = f"[{w['workload']}](docs/results.md#{w['anchor']})"
            out.append(
                f"| {link} | {h['measure']} | {spread(ours, h['unit'])} | {h['peer']}: {peer} | {table['date']} |"
            )
            machines.setdefault(table["machine"], None)
    out += ["", "Measured on " + "; ".join(machines) + "."]
    return out


def table_md(t: dict) -> list[str]:
    cols = t["columns"]
    out = [f"### {t['title']}", ""]
    out += ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    for r in t["rows"]:
        cells = [fmt(r.get(k)) + (f" ({r['source']})" if k == "system" and "source" in r else "") for k, _ in cols]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    for field in t.get("summarise", []):
        header = dict(cols)[field]
        for system in _systems(t["rows"]):
            values = [r[field] for r in t["rows"] if r.get("system") == system and field in r]
            if len(values) > 1:
                out.append(f"- {system}, {header}: {spread(values)}")
    if t.get("summarise"):
        out.append("")
    out += _provenance(t)
    return out


def _provenance(t: dict) -> list[str]:
    out = [f"Measured {t['date']} on {t['machine']}: `{t['command']}`."]
    if t.get("note"):
        out += ["", t["note"]]
    return out + [""]


def curve_name(w: dict, c: dict) -> str:
    return f"results_{w['file']}_{c['id']}.svg"


def curve_md(w: dict, c: dict) -> list[str]:
    runs = len(c["series"])
    out = [f"### {c['title']}", "", f"![{c['title']}](img/{curve_name(w, c)})", ""]
    out += [f"{runs} run{'s' if runs > 1 else ''}, one line each."] + [""] + _provenance(c)
    return out


def page(workloads: list[dict]) -> str:
    lines = [
        "# Results",
        "",
        "<!-- Written by `python benchmarks/render.py` from benchmarks/results/*.json: edit the data, not the page -->",
        "",
        "Each figure comes with the machine, the date and the command that reproduces it. Asynchronous runs do not",
        "repeat: where several runs were made, every run is given, with the median and the range. The benchmarks'",
        "scripts and what they measure: `benchmarks/README.md`.",
        "",
        "## Headline",
        "",
        *[row.replace("(docs/results.md#", "(#") for row in headline_rows(workloads)],
        "",
    ]
    for w in workloads:
        lines += [f"## {w['workload']}", "", w["about"], ""]
        for t in w["tables"]:
            lines += table_md(t)
        for c in w["curves"]:
            lines += curve_md(w, c)
    return "\n".join(lines).rstrip("\n") + "\n"


def readme_with_headline(readme: str, workloads: list[dict]) -> str:
    """The README with the headline table between its markers replaced."""
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + "\n" + "\n".join(headline_rows(workloads)) + "\n" + END + tail


def plot(w: dict, c: dict) -> str:
    """One curve's figure as SVG text (deterministic: fixed hash salt, no date)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "msf-results"
    timed = all(len(p) > 2 for s in c["series"] for p in s["points"])
    fig, axes = plt.subplots(1, 2 if timed else 1, figsize=(10 if timed else 6, 3.6), squeeze=False)
    colours: dict[str, str] = {}
    for s in c["series"]:
        colour = colours.setdefault(s["system"], f"C{len(colours)}")
        label = f"{s['system']}, seed {s['seed']}"
        xs, ys = [p[0] for p in s["points"]], [p[1] for p in s["points"]]
        axes[0][0].plot(xs, ys, marker="o", markersize=3, color=colour, label=label)
        if timed:
            axes[0][1].plot([p[2] for p in s["points"]], ys, color=colour, label=label)
    axes[0][0].set_xlabel(c["x"])
    if timed:
        axes[0][1].set_xlabel("seconds since the start")
    for ax in axes[0]:
        ax.set_ylabel("mean return (last 100 episodes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(c["title"], fontsize=9)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()


def outputs(workloads: list[dict], with_plots: bool = True) -> dict[Path, str]:
    """Every file the data gives, path -> text (the plots only ``with_plots``)."""
    out = {PAGE: page(workloads), README: readme_with_headline(README.read_text(), workloads)}
    if with_plots:
        out.update({IMG / curve_name(w, c): plot(w, c) for w in workloads for c in w["curves"]})
    return out


def add_run(exp_dir: str, workload: str, curve: str, system: str, seed: int) -> None:
    """Append a run's TensorBoard curve (``episode/return_mean`` against env frames and wall time) as a series of
    ``curve`` of ``benchmarks/results/<workload>.json``; the curve must exist there (its title, date, machine and
    command written by hand once)."""
    sys.path.insert(0, str(ROOT / "src"))
    from msf.plot import read_curves

    ret = read_curves(exp_dir)["episode/return_mean"]
    points = [[int(s), round(float(v), 2), round(float(t), 1)] for s, v, t in zip(ret.steps, ret.values, ret.wall_time)]
    path = RESULTS / f"{workload}.json"
    data = json.loads(path.read_text())
    target = next(c for c in data["curves"] if c["id"] == curve)
    target["series"].append({"system": system, "seed": seed, "points": points})
    path.write_text(json.dumps(data, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    p.add_argument("--add_run", metavar="EXP_DIR", help="append this experiment's curve to --to's --curve first")
    p.add_argument("--to"), p.add_argument("--curve"), p.add_argument("--system", default="msf")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.add_run:
        add_run(args.add_run, args.to, args.curve, args.system, args.seed)
    stale = []
    for path, text in outputs(load()).items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for path in stale:
        print(f"out of date: {path.relative_to(ROOT)} (run python benchmarks/render.py)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
