"""Plots of the benchmarks' results for docs/benchmarks.md.

Reads the JSON documents the benchmarks printed, stored unchanged under
`docs/benchmarks/results/`, one file per run, named after the script that printed it
(`end_to_end-<what>.json`, `startup-<what>.json`, `scale-<what>.json`), and writes PNG plots to
`docs/benchmarks/`:

* `throughput.png`: events/s of txstream beside its peers on the same work: Pathway's group-by
  from Kafka to PostgreSQL (`bench/end_to_end.py`, `groupby_saturation`), and the example
  pipeline and the group-by in the engine beside Apache Flink (`bench/scale.py`);
* `latency.png`: produce-to-visible latency at low load and under a backlog (p50, p99, max:
  `bench/end_to_end.py`), and a lone transaction's engine time (`bench/scale.py`);
* `scale.png`: parallelism 1 against 2 (`bench/scale.py`), txstream and Flink;
* `startup.png`: the lives of `bench/startup.py`: Spark's start, the first commit, caught up;
* `stress.png`: which seeds of `bench/stress.py` held, one row per result file (a revision);
* `temporal.png`: event-time windows with and without a behavior, and sessions
  (`bench/temporal.py`): state rows and the JVM heap as the events grow, and events/s beside
  Pathway and Flink in the engine; and the windows Kafka to PostgreSQL beside Pathway
  (`bench/temporal_end_to_end.py`);
* `soak.png`: the longest run of `bench/soak.py` over time (memory, threads and descriptors,
  checkpoint and table bytes, latency and lag), its faults marked.

Documents of one script are merged in the order they were run (a later run's sections win):
by the `date` a document holds, those without one first, in file name order. So one run may
hold the group-by and another the example pipeline; `bench/stress.py`'s are kept apart, one
per revision, and of `bench/soak.py`'s only the longest run is drawn. A plot whose figures no
document holds is left out, saying so on stderr. matplotlib is a bench-only extra
(`pip install -e '.[bench]'`).

    .venv/bin/python bench/report.py [--results docs/benchmarks/results] [--out docs/benchmarks]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on the machines the benchmarks run on

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, StrMethodFormatter

ROOT = Path(__file__).resolve().parents[1]
Document = dict[str, Any]
TXSTREAM, PEER = "#1f77b4", "#ff7f0e"  # the same colours for the same systems in every plot


def load(results: Path) -> dict[str, list[tuple[str, Document]]]:
    """Script name -> (the rest of the file name, the document) of each of its files, in name
    order: `end_to_end-groupby.json` is `end_to_end`'s, `groupby`."""
    found: dict[str, list[tuple[str, Document]]] = {}
    files = sorted(results.glob("*.json"))
    if not files:
        raise SystemExit(f"no result files (*.json) in {results}: store a benchmark's printed "
                         "JSON there first, e.g. bench/startup.py > "
                         f"{results}/startup-<date>.json")
    for path in files:
        script, _, name = path.stem.partition("-")
        try:
            document = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise SystemExit(f"{path} is not the JSON a benchmark printed ({error}): keep only "
                             "its stdout in the file") from error
        found.setdefault(script, []).append((name, document))
    return found


def merged(found: dict[str, list[tuple[str, Document]]]) -> dict[str, Document]:
    """Script name -> its documents merged, a later run's sections winning (by the `date` a
    document holds, those without one first): one run may hold the group-by and another the
    example pipeline."""
    return {script: {key: value
                     for document in sorted((d for _, d in documents),
                                            key=lambda d: str(d.get("date", "")))
                     for key, value in document.items()}
            for script, documents in found.items()}


def _bars(ax: Axes, labels: list[str], values: list[float], colours: list[str],
          unit: str) -> None:
    bars = ax.bar(labels, values, color=colours)
    ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 100 else f"{v:.2f}" for v in values],
                 fontsize=8)
    ax.set_ylabel(unit)
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}" if max(values) >= 100
                                                    else "{x:.2f}"))
    ax.tick_params(axis="x", labelsize=7)


def _rate(run: Any) -> float | None:
    return run.get("events_per_s") if isinstance(run, dict) else None


def throughput(results: dict[str, Document]) -> Figure | None:
    groupby = results.get("end_to_end", {}).get("groupby_saturation")
    scale = results.get("scale", {})
    peers = [w for w in ("orders", "groupby") if _rate(scale.get(w, {}).get("runs", {})
                                                       .get("flink_P1"))]
    if groupby is None and not peers:
        return None
    fig, axes = plt.subplots(1, (groupby is not None) + len(peers), figsize=(14, 4.5),
                             squeeze=False)
    column = iter(axes[0])
    if groupby is not None:
        ax = next(column)
        labels, values, colours = [], [], []
        for policy, run in groupby["txstream"].items():
            # `transactions_of_10000_events` -> "10000 events", `..._closed_every_1500_ms`
            # -> "every 1500 ms": the label under a bar.
            labels.append("txstream\n" + policy.removeprefix("transactions_").removeprefix(
                "of_").removeprefix("closed_").replace("_", " "))
            values.append(run["events_per_s"])
            colours.append(TXSTREAM)
        for peer in ("pathway", "pathway_static"):
            if _rate(groupby.get(peer)):
                labels.append(peer.replace("_", " "))
                values.append(groupby[peer]["events_per_s"])
                colours.append(PEER)
        _bars(ax, labels, values, colours, "events/s")
        ax.set_title(f"Group-by, Kafka to PostgreSQL\n{groupby['events']:,} events "
                     "(bench/end_to_end.py)", fontsize=9)
    for workload in peers:
        ax = next(column)
        runs = scale[workload]["runs"]
        kinds = [k for k in ("P1", "P2", "warm_P1", "warm_P2")
                 if _rate(runs.get(f"local2_{k}")) and _rate(runs.get(f"flink_{k}"))]
        labels = [f"{system}\n{k.replace('_', ' ')}" for k in kinds
                  for system in ("txstream", "flink")]
        values = [runs[f"{system}_{k}"]["events_per_s"] for k in kinds
                  for system in ("local2", "flink")]
        _bars(ax, labels, values, [TXSTREAM, PEER] * len(kinds), "events/s")
        name = "example pipeline" if workload == "orders" else "group-by"
        ax.set_title(f"{name}, engine against Apache Flink\n{scale['events']:,} events, "
                     "cold JVMs (bench/scale.py)", fontsize=9)
    fig.tight_layout()
    return fig


def latency(results: dict[str, Document]) -> Figure | None:
    end_to_end = results.get("end_to_end", {})
    loads = [(name, end_to_end[name]) for name in ("low_load", "saturation")
             if name in end_to_end]
    lone = results.get("scale", {}).get("lone_transaction", {})
    lone = {p: run for p, run in lone.items() if isinstance(run, dict) and "p50_s" in run}
    if not loads and not lone:
        return None
    fig, axes = plt.subplots(1, (1 if loads else 0) + (1 if lone else 0), figsize=(10, 4.5),
                             squeeze=False)
    column = iter(axes[0])
    if loads:
        ax = next(column)
        width = 0.25
        for i, stat in enumerate(("p50_ms", "p99_ms", "max_ms")):
            xs = [j + (i - 1) * width for j in range(len(loads))]
            bars = ax.bar(xs, [doc["latency"][stat] / 1000 for _, doc in loads], width,
                          label=stat.removesuffix("_ms"))
            ax.bar_label(bars, fmt="%.2f", fontsize=8)
        ax.set_xticks(range(len(loads)),
                      [f"low load\n{doc.get('events_at_a_time', '')} events at a time"
                       if name == "low_load" else
                       f"backlog of {doc['events']:,} events\n{doc['events_per_s']:,} events/s"
                       for name, doc in loads], fontsize=8)
        ax.set_xlim(-0.75, len(loads) - 0.25)
        ax.set_yscale("log")
        # Bars on a log axis start at its bottom: a fixed one keeps their heights comparable.
        ax.set_ylim(0.1, 2 * max(doc["latency"]["max_ms"] for _, doc in loads) / 1000)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_ylabel("seconds from produce to visible in PostgreSQL")
        ax.set_title("Example pipeline end to end (bench/end_to_end.py)", fontsize=9)
        ax.legend(fontsize=8)
    if lone:
        ax = next(column)
        labels = [p.replace("local2_", "parallelism ").replace("P", "") for p in lone]
        _bars(ax, labels, [run["p50_s"] for run in lone.values()], [TXSTREAM] * len(lone),
              "seconds (p50 of planning + execution)")
        ax.set_title("A lone 10-event transaction in the engine\n(20,000 events of state; "
                     "bench/scale.py)", fontsize=9)
    fig.tight_layout()
    return fig


def scale(results: dict[str, Document]) -> Figure | None:
    document = results.get("scale", {})
    workloads = [w for w in ("orders", "groupby") if w in document]
    if not workloads:
        return None
    fig, axes = plt.subplots(1, len(workloads), figsize=(11, 4.5), squeeze=False)
    for ax, workload in zip(axes[0], workloads, strict=True):
        runs = document[workload]["runs"]
        setups = [(label, one, two) for label, one, two in (
            ("txstream local[2]", "local2_P1", "local2_P2"),
            ("txstream local[2], warm", "local2_warm_P1", "local2_warm_P2"),
            ("txstream standalone\n(1 and 2 workers)", "cluster_1w", "cluster_2w"),
            ("Flink", "flink_P1", "flink_P2"),
            ("Flink, warm", "flink_warm_P1", "flink_warm_P2"))
            if _rate(runs.get(one)) and _rate(runs.get(two))]
        width = 0.38
        for i, (p, colour) in enumerate((("parallelism 1", "#9ecae1"),
                                         ("parallelism 2", "#3182bd"))):
            xs = [j + (i - 0.5) * width for j in range(len(setups))]
            bars = ax.bar(xs, [runs[s[1 + i]]["events_per_s"] for s in setups], width,
                          label=p, color=colour)
            ax.bar_label(bars, fmt="{:,.0f}", fontsize=7)
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        ax.set_xticks(range(len(setups)), [s[0] for s in setups], fontsize=8)
        ax.set_ylabel("events/s")
        name = "example pipeline" if workload == "orders" else "group-by"
        ax.set_title(f"{name}: one core against two\n{document['events']:,} events "
                     "(bench/scale.py)", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def startup(results: dict[str, Document]) -> Figure | None:
    document = results.get("startup", {})
    lives = [name for name in ("cold_start", "restart", "after_kill_9", "stop_when_idle")
             if name in document]
    if not lives:
        return None
    fig, ax = plt.subplots(figsize=(9, 3.8))
    marks = (("spark_start_s", "Spark session up", "#c6dbef"),
             ("first_commit_s", "first commit", "#6baed6"),
             ("caught_up_s", "caught up", "#08519c"))
    for row, life in enumerate(reversed(lives)):
        before = 0.0
        for key, label, colour in marks:
            at = document[life].get(key)
            if at is None:
                continue
            ax.barh(row, at - before, left=before, color=colour,
                    label=label if row == 0 else None)
            if at > before:  # caught up with the first commit: one figure, written once
                ax.text(at, row + 0.3, f"{at:.1f}", ha="right", fontsize=8)
            before = at
    ax.set_xlim(0, 1.05 * max(document[life].get("caught_up_s") or 0 for life in lives))
    ax.set_yticks(range(len(lives)), [life.replace("_", " ").replace("kill 9", "kill -9")
                                      for life in reversed(lives)])
    ax.set_xlabel("seconds from the spawn of txstream run")
    ax.set_title(f"Start-up with a backlog of {document.get('events_per_life', 0):,} events "
                 "per life, seen from PostgreSQL (bench/startup.py)", fontsize=9)
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    fig.tight_layout()
    return fig


def stress(found: dict[str, list[tuple[str, Document]]]) -> Figure | None:
    runs = [(name, document) for name, document in found.get("stress", [])
            if document.get("details")]
    if not runs:
        return None
    seeds = sorted({run["seed"] for _, document in runs for run in document["details"]})
    fig, ax = plt.subplots(figsize=(11, 1 + 0.7 * len(runs)))
    for row, (_, document) in enumerate(reversed(runs)):
        for run in document["details"]:
            column = seeds.index(run["seed"])
            ax.add_patch(Rectangle((column, row), 0.9, 0.8,
                                   color="#74c476" if run["held"] else "#de2d26"))
            ax.text(column + 0.45, row + 0.4, str(run["batch_transactions"]), ha="center",
                    va="center", fontsize=7)
    ax.set_xlim(0, len(seeds))
    ax.set_ylim(0, len(runs))
    ax.set_xticks([i + 0.45 for i in range(len(seeds))], [str(s) for s in seeds], fontsize=8)
    ax.set_yticks([i + 0.4 for i in range(len(runs))],
                  [f"{name}: {d['held']} of {d['runs']} held"
                   for name, d in reversed(runs)], fontsize=8)
    ax.set_xlabel("seed (the number in a cell: its batch_transactions; green held, red failed)")
    ax.set_title("The example pipeline under load, exact or not (bench/stress.py)", fontsize=9)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def temporal(results: dict[str, Document]) -> Figure | None:
    document = results.get("temporal", {})
    pipelines = [name for name in ("exactly_once", "no_behavior", "sessions")
                 if name in document]
    if "exactly_once" not in pipelines:
        return None
    end_to_end = results.get("temporal_end_to_end", {})
    shown = _rate(end_to_end.get("txstream")) is not None
    fig, (rows, heap, rate, *kafka) = plt.subplots(1, 3 + shown, figsize=(14 + 4 * shown, 4))
    colours = {"exactly_once": TXSTREAM, "no_behavior": "#9ecae1", "sessions": "#31a354"}
    for name in pipelines:
        samples = document[name]["samples"]
        events = [sample["events"] for sample in samples]
        label = name.replace("_", " ")
        rows.plot(events, [max(sample["state_rows"], 1) for sample in samples], "o-",
                  color=colours[name], label=label)
        heap.plot(events, [sample["jvm_heap_mb_after_gc"] for sample in samples], "o-",
                  color=colours[name], label=label)
    rows.set_yscale("log")
    rows.set_ylabel("state rows (log)")
    heap.set_ylabel("JVM heap after GC (MB)")
    for ax, title in ((rows, "State rows"), (heap, "Memory")):
        ax.set_xlabel("events")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1e6:.0f}M"))
        ax.set_title(f"{title} (bench/temporal.py)", fontsize=9)
        ax.legend(fontsize=8)
    labels = [name.replace("_", " ") + ("" if document[name]["events"]
                                        == document["exactly_once"]["events"]
                                        else f"\n{document[name]['events'] / 1e6:.0f}M views")
              for name in pipelines]
    values = [document[name]["events_per_s"] for name in pipelines]
    colour_list = [colours[name] for name in pipelines]
    if _rate(document.get("pathway")):
        labels.append("pathway\nexactly once")
        values.append(document["pathway"]["events_per_s"])
        colour_list.append(PEER)
    for name, label in (("flink_exactly_once", "flink\nTUMBLE"), ("flink_sessions",
                                                                  "flink\nSESSION")):
        if _rate(document.get(name)):
            labels.append(label)
            values.append(document[name]["events_per_s"])
            colour_list.append("#fdae6b")  # a second peer, beside Pathway's
    _bars(rate, labels, values, colour_list, "events/s")
    rate.set_title(f"Per-user minute windows and sessions, "
                   f"{document['exactly_once']['events']:,} views", fontsize=9)
    if kafka:
        labels, values = ["txstream"], [end_to_end["txstream"]["events_per_s"]]
        if _rate(end_to_end.get("pathway")):
            labels.append("pathway")
            values.append(end_to_end["pathway"]["events_per_s"])
        _bars(kafka[0], labels, values, [TXSTREAM, PEER][:len(values)], "events/s")
        kafka[0].set_title("Exactly-once minute windows, Kafka to PostgreSQL\n"
                           f"{end_to_end['events']:,} views "
                           "(bench/temporal_end_to_end.py)", fontsize=9)
    fig.tight_layout()
    return fig


def soak(found: dict[str, list[tuple[str, Document]]]) -> Figure | None:
    runs = [document for _, document in found.get("soak", []) if document.get("samples")]
    if not runs:
        return None
    run = max(runs, key=lambda d: d["seconds"])
    samples = run["samples"]
    minutes = [sample["at_s"] / 60 for sample in samples]

    def series(key: Callable[[Document], Any]) -> list[float]:
        return [float("nan") if (value := key(sample)) is None else value for sample in samples]

    fig, axes = plt.subplots(2, 3, figsize=(16, 7.5), sharex=True)
    memory, counts, storage, tables, latency, lag = axes.flat
    memory.plot(minutes, series(lambda s: s.get("jvm_rss_mb")), label="driver JVM RSS")
    memory.plot(minutes, series(lambda s: s.get("python_rss_mb")), label="service Python RSS")
    memory.plot(minutes, series(lambda s: s.get("heap_after_gc_mb")),
                label="JVM heap after the last GC")
    memory.plot(minutes, series(lambda s: s.get("heap_after_full_gc_mb")), ".",
                label="JVM heap after the last full GC")
    memory.set_ylabel("MB")
    for side, style in (("jvm", "-"), ("python", "--")):
        counts.plot(minutes, series(lambda s, side=side: s.get(f"{side}_threads")), style,
                    color=TXSTREAM, label=f"{side} threads")
        counts.plot(minutes, series(lambda s, side=side: s.get(f"{side}_fds")), style,
                    color=PEER, label=f"{side} descriptors")
    storage.plot(minutes, series(lambda s: (s.get("checkpoints_bytes") or 0) / 1e6),
                 label="checkpoints (kept, being written)")
    storage.plot(minutes, series(lambda s: (s.get("txlog_bytes") or 0) / 1e6),
                 label="transaction log")
    storage.set_ylabel("MB")
    for name in sorted({name for sample in samples for name in sample.get("postgres_bytes")
                        or {}}):
        tables.plot(minutes, series(lambda s, name=name: None if s.get("postgres_bytes") is None
                                    else s["postgres_bytes"][name] / 1e6), label=name)
    tables.set_ylabel("MB")
    latency.plot(minutes, series(lambda s: s.get("latency_p50_s")), label="p50")
    latency.plot(minutes, series(lambda s: s.get("latency_p99_s")), label="p99")
    latency.set_yscale("log")
    latency.set_ylabel("seconds (log)")
    lag.plot(minutes, series(lambda s: s.get("lag")), color=TXSTREAM, label="records not yet in "
             "a committed transaction")
    for ax, title in ((memory, "Memory"), (counts, "Threads and file descriptors"),
                      (storage, "Checkpoint storage"), (tables, "PostgreSQL tables (bytes)"),
                      (latency, "End-to-end latency per 10 s (from the histogram)"),
                      (lag, "Consumer lag")):
        for fault in run["faults"]:
            ax.axvline(fault["at_s"] / 60, color="#999999", linestyle=":", linewidth=1)
            ax.text(fault["at_s"] / 60, 1.0, fault["kind"], rotation=90, fontsize=6,
                    va="top", ha="right", transform=ax.get_xaxis_transform())
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("minutes")
    settings = run["settings"]
    fig.suptitle(f"bench/soak.py: {run['seconds'] / 60:.0f} min at {settings['rate']:,.0f} "
                 f"events/s, {run['events']:,} events, "
                 f"{'held' if run['held'] else 'did NOT hold'}", fontsize=10)
    fig.tight_layout()
    return fig


PLOTS: dict[str, Callable[[dict[str, Document]], Figure | None]] = {
    "throughput": throughput, "latency": latency, "scale": scale, "startup": startup,
    "temporal": temporal}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "benchmarks" / "results")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    args = parser.parse_args()
    found = load(args.results)
    results = merged(found)
    args.out.mkdir(parents=True, exist_ok=True)
    figures = {name: plot(results) for name, plot in PLOTS.items()} | {
        "stress": stress(found), "soak": soak(found)}
    for name, figure in figures.items():
        if figure is None:
            print(f"{name}.png: no result file holds its figures; left out", file=sys.stderr)
            continue
        # No software version in the file, so that the same results give the same bytes.
        figure.savefig(args.out / f"{name}.png", dpi=100, metadata={"Software": None})
        plt.close(figure)
        print(f"wrote {args.out / f'{name}.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()
