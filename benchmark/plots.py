"""PNG plots of the benchmark tables: throughput vs batch per engine, TTFT/ITL percentiles per
server, retraction modes. Needs matplotlib (`pip install -e '.[bench]'`).

The benchmark scripts call `save_plot(kind, headers, rows, path)` right after printing their table
(so every run writes its picture next to its table); `python benchmark/plots.py` redraws the
pictures embedded in RESULTS.md from the tables recorded there (the same numbers, nothing new):

    .venv/bin/python benchmark/plots.py            # -> benchmark/plots/*.png
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
PLOT_DIR = os.path.join(HERE, "plots")

# RESULTS.md heading (prefix) -> (plot kind, output file)
RESULTS_PLOTS = [
    ("Issue 15 targets: bf16", "throughput", "offline_bf16_issue15.png"),
    ("Issue 15 targets: fp32", "throughput", "offline_fp32_issue15.png"),
    ("Offline throughput, fp32, all peers", "throughput", "offline_fp32.png"),
    ("Offline throughput, bf16, all peers", "throughput", "offline_bf16.png"),
    ("Serving, idle machine", "latency", "serving.png"),
    ("Retraction under decode memory pressure", "retraction", "retraction.png"),
    ("Retraction of hybrid SSM models", "retraction", "retraction_ssm.png"),
]


def _num(v) -> Optional[float]:
    m = re.match(r"^\s*\**([0-9.]+)", str(v))
    return float(m.group(1)) if m else None


def _col(headers: Sequence[str], *names: str) -> Optional[int]:
    for name in names:
        if name in headers:
            return list(headers).index(name)
    return None


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: str, title: str) -> None:
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_throughput(headers, rows, path: str, title: str = "") -> None:
    """Output tok/s against batch size, one line per engine (one panel per model:dtype)."""
    plt = _plt()
    wi, ei, ti, mi = (_col(headers, "workload"), _col(headers, "engine"), _col(headers, "out tok/s"),
                      _col(headers, "model:dtype"))
    panels: Dict[str, Dict[str, List]] = {}
    for r in rows:
        batch, tps = _num(str(r[wi]).split(":")[0]), _num(r[ti])
        if batch is None or tps is None:
            continue
        panels.setdefault(str(r[mi]) if mi is not None else "", {}).setdefault(str(r[ei]), []).append((batch, tps))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (panel, engines) in zip(axes[0], panels.items()):
        for engine, pts in engines.items():
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=engine,
                    linewidth=2.5 if engine == "ours" else 1.5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("output tok/s")
        ax.set_title(panel or title)
        ax.grid(alpha=0.3)
        ax.legend()
    _save(plt, fig, path, title if panels and list(panels)[0] else "")


def plot_latency(headers, rows, path: str, title: str = "") -> None:
    """TTFT and ITL (mean, p50, p99) per server, as grouped bars."""
    plt = _plt()
    si = _col(headers, "server")
    groups = [("TTFT", ["TTFT mean ms", "TTFT p50", "TTFT p99"]), ("ITL", ["ITL mean ms", "ITL p50", "ITL p99"])]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (name, cols) in zip(axes, groups):
        idx = [_col(headers, c) for c in cols]
        width = 0.8 / max(len(rows), 1)
        for k, r in enumerate(rows):
            vals = [_num(r[i]) or 0.0 for i in idx]
            ax.bar([x + k * width for x in range(len(cols))], vals, width, label=str(r[si]))
        ax.set_xticks([x + width * (len(rows) - 1) / 2 for x in range(len(cols))], ["mean", "p50", "p99"])
        ax.set_ylabel(f"{name} ms")
        ax.set_title(name)
        ax.grid(alpha=0.3, axis="y")
        ax.legend()
    _save(plt, fig, path, title)


def plot_retraction(headers, rows, path: str, title: str = "") -> None:
    """Per retraction mode: output tok/s and prompt tokens computed again (one colour per model)."""
    plt = _plt()
    mo, ti, ri, mi = (_col(headers, "mode"), _col(headers, "out tok/s"), _col(headers, "recomputed tokens"),
                      _col(headers, "model"))
    models: Dict[str, List] = {}
    for r in rows:
        models.setdefault(str(r[mi]) if mi is not None else "", []).append(r)
    modes = list(dict.fromkeys(str(r[mo]) for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / max(len(models), 1)
    for k, (model, rs) in enumerate(models.items()):
        by_mode = {str(r[mo]): r for r in rs}
        xs = [i + k * width for i in range(len(modes))]
        axes[0].bar(xs, [_num(by_mode[m][ti]) or 0 if m in by_mode else 0 for m in modes], width, label=model or None)
        axes[1].bar(xs, [_num(by_mode[m][ri]) or 0 if m in by_mode else 0 for m in modes], width, label=model or None)
    for ax, label in zip(axes, ("output tok/s", "recomputed prompt tokens")):
        ax.set_xticks([i + width * (len(models) - 1) / 2 for i in range(len(modes))], modes)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
        if len(models) > 1:
            ax.legend()
    _save(plt, fig, path, title)


PLOTTERS = {"throughput": plot_throughput, "latency": plot_latency, "retraction": plot_retraction}


def save_plot(kind: str, headers, rows, path: str, title: str = "") -> Optional[str]:
    """Draws the table as a PNG at `path`; says so, or why not (no matplotlib), and never raises
    (a benchmark's numbers matter more than its picture)."""
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        PLOTTERS[kind](headers, rows, path, title)
    except ImportError:
        print("plot skipped: matplotlib is not installed (pip install -e '.[bench]')", flush=True)
        return None
    except Exception as e:  # noqa: BLE001
        print(f"plot skipped: {type(e).__name__}: {e}", flush=True)
        return None
    print(f"plot: {path}", flush=True)
    return path


def markdown_tables(text: str) -> Dict[str, tuple]:
    """`## heading` -> (headers, rows) of the first table under it."""
    out, heading, lines = {}, None, text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            heading = line[3:].strip()
        elif line.startswith("|") and heading and heading not in out and i + 1 < len(lines) \
                and re.match(r"^\|[\s:|-]+\|$", lines[i + 1].strip()):
            headers = [c.strip() for c in line.strip().strip("|").split("|")]
            rows, j = [], i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append([c.strip() for c in lines[j].strip().strip("|").split("|")])
                j += 1
            out[heading] = (headers, rows)
            i = j
            continue
        i += 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--out", default=PLOT_DIR)
    args = ap.parse_args(argv)
    with open(args.results) as f:
        tables = markdown_tables(f.read())
    written = 0
    for prefix, kind, name in RESULTS_PLOTS:
        match = next((h for h in tables if h.startswith(prefix)), None)
        if match is None:
            print(f"no table under a heading starting with {prefix!r}", file=sys.stderr)
            continue
        headers, rows = tables[match]
        written += save_plot(kind, headers, rows, os.path.join(args.out, name), match) is not None
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
