"""Results tables as Markdown and their bar charts, and ``Table``, the Rich table of every report (it never cuts
a value). Formatting only: the numbers come computed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table as _RichTable

from gpualloc.reports import pyplot, save_png


def _pm(row: dict[str, Any], key: str, fmt: str, scale: float = 1.0) -> str:
    std = row.get(f"{key}_std")
    text = _mean(row, key, fmt, scale)
    return text if not std or text == "-" else f"{text} ± {format(std * scale, fmt)}"


def _defined_in(row: dict[str, Any], key: str) -> str:
    """`` (k of n seeds)`` where ``row[key]`` is a mean over fewer seeds than the row's (a metric
    undefined in some, e.g. utilisation while jobs wait where no job waited), else nothing."""
    runs = row.get(f"{key}_runs")
    return "" if runs is None or not runs else f" ({runs} of {row.get('seeds', '?')} seeds)"


def _mean(row: dict[str, Any], key: str, fmt: str, scale: float = 1.0) -> str:
    """``row[key]`` formatted, ``-`` where it is missing or NaN (e.g. no job ever waited)."""
    value = row.get(key)
    return "-" if value is None or value != value else format(value * scale, fmt)


def placement_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """One Markdown table: a row per (model, cluster, method)."""
    head = ("| model | cluster | method | training time (s) | vs static | vs best | utilisation | MFU | "
            "exposed comm | energy (MJ) | avg power (W) | re-plans |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['cluster']} | {r['method']} | {_pm(r, 'training_time_s', '.1f')} | "
            f"{r['gain_vs_static']:+.1%} | {r['gain_vs_best']:+.1%} | {_pm(r, 'utilization', '.1%')} | "
            f"{_pm(r, 'mfu', '.1%')} | {_pm(r, 'comm_overhead', '.1%')} | {_pm(r, 'energy_j', '.2f', 1e-6)} | "
            f"{_pm(r, 'avg_power_w', '.0f')} | {_pm(r, 'replans', '.1f')} |")
    return "\n".join(lines) + "\n"


def placement_hybrid_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """One Markdown table of single steps: a row per (model, cluster, hybrid method or op-level reference)."""
    head = ("| model | cluster | batch | method | plan | step (ms) | samples/s | × bound | vs ddp | utilisation | "
            "fits |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['cluster']} | {r['global_batch']} | {r['method']} | {r['plan']} | "
            f"{_pm(r, 'step_time_s', '.2f', 1e3)} | {_pm(r, 'samples_per_s', ',.0f')} | "
            f"{_pm(r, 'ratio_to_bound', '.2f')} | {_pm(r, 'speedup_vs_ddp', '.2f')}× | "
            f"{_pm(r, 'utilization', '.1%')} | {'yes' if r['feasible'] else 'no'} |")
    return "\n".join(lines) + "\n"


def bars_figure(rows: Sequence[dict[str, Any]], group_keys: Sequence[str], series_key: str, value_key: str, *,
                ylabel: str, title: str, scale: float = 1.0, log: bool = False):
    """Grouped bar chart as a Figure: one group per distinct ``group_keys`` tuple, one bar per
    ``series_key``, error bars from ``value_key + "_std"``; values times ``scale`` (the table's unit);
    ``log``: a logarithmic value axis (values spanning orders of magnitude)."""
    import numpy as np

    plt = pyplot()
    groups = list(dict.fromkeys(tuple(r[k] for k in group_keys) for r in rows))
    series = list(dict.fromkeys(r[series_key] for r in rows))
    by = {(tuple(r[k] for k in group_keys), r[series_key]): r for r in rows}
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(7, 1.4 * len(groups) * max(1, len(series) / 4)) + 2, 4.5))
    x = np.arange(len(groups))
    palette = plt.get_cmap("tab10" if len(series) <= 10 else "tab20")  # one distinct colour per series
    for i, s in enumerate(series):
        vals = [by[(g, s)][value_key] * scale if (g, s) in by else np.nan for g in groups]
        errs = [(by[(g, s)].get(f"{value_key}_std") or 0.0) * scale if (g, s) in by else 0.0 for g in groups]
        ax.bar(x + (i - (len(series) - 1) / 2) * width, vals, width, yerr=errs, label=str(s), capsize=2,
               color=palette(i % palette.N))
    ax.set_xticks(x, ["\n".join(map(str, g)) for g in groups])
    ax.set_xlabel(" / ".join(group_keys))
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    # beside the axes, so that it never covers a bar
    ax.legend(fontsize=8, title=series_key, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_bars(rows: Sequence[dict[str, Any]], group_keys: Sequence[str], series_key: str, value_key: str,
              path: str | Path, *, ylabel: str, title: str = "", scale: float = 1.0, log: bool = False) -> Path:
    """Write :func:`bars_figure` to a PNG at ``path``; returns the path."""
    fig = bars_figure(rows, group_keys, series_key, value_key, ylabel=ylabel, title=title or ylabel, scale=scale,
                      log=log)
    return save_png(fig, path)


def scheduling_summary_markdown(rows: Sequence[dict[str, Any]], learned: str = "dqn") -> str:
    """The learned policy against the best heuristic of each (cluster, trace, load), ours included
    and published only; empty where no row of ``learned`` ran."""
    groups: dict[tuple, dict[str, dict[str, Any]]] = {}
    levels = any("knowledge" in r for r in rows)  # a column for the information level when rows say it
    for r in rows:
        key = (r.get("cluster", "-"), r["trace"], r["load"]) + ((r.get("knowledge", "oracle"),) if levels else ())
        groups.setdefault(key, {})[r["policy"]] = r
    head = ("| cluster | trace | load | " + ("knowledge | " if levels else "") +
            f"best heuristic | its avg JCT (h) | best published | its avg JCT (h) | "
            f"`{learned}` avg JCT (h) | `{learned}` vs best [95% CI] | `{learned}` vs best published [95% CI] | "
            f"`{learned}-hd` vs best | `{learned}` p99 JCT (h) | `{learned}` makespan (h) | "
            f"`{learned}` util. while jobs wait | best heuristic's util. while jobs wait |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for (cluster, trace, load, *level), group in groups.items():
        mine = group.get(learned)
        if mine is None or "best_heuristic" not in mine:
            continue
        best, pub = group[mine["best_heuristic"]], group[mine.get("best_published", mine["best_heuristic"])]
        lines.append(
            f"| {cluster} | {trace} | {load:g} | " + "".join(f"{k} | " for k in level) +
            f"{best['policy']} | {_pm(best, 'avg_jct_s', '.2f', 1 / 3600)} | "
            f"{pub['policy']} | {_pm(pub, 'avg_jct_s', '.2f', 1 / 3600)} | {_pm(mine, 'avg_jct_s', '.2f', 1 / 3600)} | "
            f"{_vs(mine, 'best')} | {_vs(mine, 'best_published')} | {_vs(group.get(f'{learned}-hd', {}), 'best')} | "
            f"{mine['p99_jct_s'] / 3600:.1f} | {mine['makespan_s'] / 3600:.0f} | "
            f"{_mean(mine, 'saturated_utilization', '.1%')}{_defined_in(mine, 'saturated_utilization')} | "
            f"{_mean(best, 'saturated_utilization', '.1%')}{_defined_in(best, 'saturated_utilization')} |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def scheduling_levels_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """Each information level side by side: per (cluster, trace, load), a line per policy with its
    average JCT at every level and, in brackets, its reduction against the oracle ``gavel-srtf`` of the
    same workload (negative: worse). A prediction-driven policy shares the line of the policy it runs
    on predictions (``srtf`` at oracle and estimate, ``srtf-pred`` at blind); the best heuristic of each
    level is in bold; ``oracle-lb`` (the bound) has its oracle figure only. Empty with fewer than two
    levels."""
    order = ("oracle", "estimate", "blind")
    levels = [k for k in order if any(r.get("knowledge") == k for r in rows if r["policy"] != "oracle-lb")]
    if len(levels) < 2:
        return ""
    groups: dict[tuple, dict[str, dict[str, dict[str, Any]]]] = {}
    for r in rows:
        family = r["policy"].removesuffix("-pred")
        key = (r.get("cluster", "-"), r["trace"], r["load"])
        level = "oracle" if r["policy"] == "oracle-lb" else r.get("knowledge", "oracle")
        groups.setdefault(key, {}).setdefault(family, {})[level] = r
    head = "| cluster | trace | load | policy | " + " | ".join(f"{k}: avg JCT (h) [vs oracle gavel-srtf]"
                                                             for k in levels) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for (cluster, trace, load), families in groups.items():
        for by_level in families.values():
            names = dict.fromkeys(r["policy"] for r in by_level.values())
            cells = []
            for k in levels:
                r = by_level.get(k)
                if r is None:
                    cells.append("-")
                    continue
                text = _mean(r, "avg_jct_s", ".2f", 1 / 3600)
                if "vs_oracle_gavel_srtf" in r:
                    text += f" [{r['vs_oracle_gavel_srtf']:+.1%}]"
                cells.append(f"**{text}**" if r.get("best_heuristic") == r["policy"] else text)
            lines.append(f"| {cluster} | {trace} | {load:g} | {' / '.join(names)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _vs(row: dict[str, Any], key: str) -> str:
    """``vs_<key>`` of a row as a signed percentage, with its paired CI when there is one."""
    if f"vs_{key}" not in row:
        return "-"
    out = f"{row[f'vs_{key}']:+.1%}"
    if row.get(f"vs_{key}_ci95"):
        lo, hi = row[f"vs_{key}_ci95"]
        out += f" [{lo:+.1%}, {hi:+.1%}]"
    return out


def scheduling_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """One Markdown table: a row per (cluster, trace, load, policy); ``vs best`` is the JCT reduction
    against the best heuristic of the same trace, ours included, and ``vs best published`` against
    the best published one (each with the paired 95% CI over seeds for learned rows)."""
    levels = any("knowledge" in r for r in rows)  # a column for the information level when rows say it
    head = ("| cluster | trace | load | " + ("knowledge | " if levels else "") +
            "policy | avg JCT (h) | 95% CI (h) | vs FCFS | vs best heuristic | "
            "vs best published | x bound | jobs/h | utilisation | util. while jobs wait | p99 JCT (h) | "
            "makespan (h) | HyperScore |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        ci = r.get("avg_jct_s_ci95")
        lines.append(
            f"| {r.get('cluster', '-')} | {r['trace']} | {r['load']:g} | "
            + (f"{r.get('knowledge', 'oracle')} | " if levels else "") + f"{r['policy']} | "
            f"{_pm(r, 'avg_jct_s', '.2f', 1 / 3600)} | "
            f"{'-' if not ci else f'{ci[0] / 3600:.2f} – {ci[1] / 3600:.2f}'} | {r['vs_fcfs']:+.1%} | "
            f"{_vs(r, 'best')} | {_vs(r, 'best_published')} | "
            f"{r['x_bound']:.2f} | {_pm(r, 'throughput_jobs_per_h', '.3f')} | {_pm(r, 'utilization', '.1%')} | "
            f"{_pm(r, 'saturated_utilization', '.1%')}{_defined_in(r, 'saturated_utilization')} | "
            f"{_pm(r, 'p99_jct_s', '.1f', 1 / 3600)} | "
            f"{_pm(r, 'makespan_s', '.0f', 1 / 3600)} | "
            f"{_pm(r, 'hyperscore', '.3f')} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- Rich tables
class Table(_RichTable):
    """A Rich table that never cuts a value: every Rich table of the CLI is one of these.

    On a terminal narrower than the table, headers wrap first (at word boundaries); if that is not enough,
    whole columns are dropped -- those in ``drop_first`` in that order, then the others from the right,
    never the first -- and a line under the table names them and how to see them (``more``). Every cell
    left keeps its full width. When the output is not a terminal (a file, a pipe), every column is
    printed in full whatever the width (the CLI's console does not crop such lines).

    Args:
        *args, **kwargs: as :class:`rich.table.Table`.
        drop_first: column headers, the least important first.
        more: how to see every column, for the note: ``"--json"``, ``"--csv"``; by default a wider
            terminal or a file.
    """

    def __init__(self, *args, drop_first: Sequence[str] = (), more: str = "", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.drop_first = tuple(drop_first)
        self.more = more

    def __rich_console__(self, console, options):
        if not console.is_terminal:
            width = self._natural_width(console, options)
            yield from super().__rich_console__(console, options.update(width=width))
            return
        if self._natural_width(console, options) <= options.max_width:
            yield from super().__rich_console__(console, options)
            return
        table, dropped = self._fitted(console, options)
        yield from _RichTable.__rich_console__(table, console, options)
        if dropped:
            from rich.text import Text

            how = f"with {self.more} or a wider terminal" if self.more else "in a wider terminal or a file"
            yield Text(f"({len(dropped)} column(s) left out at {options.max_width} columns: "
                       f"{', '.join(dropped)}; see them {how})", style="dim")

    def __rich_measure__(self, console, options):
        from rich.measure import Measurement

        if not console.is_terminal:
            width = self._natural_width(console, options)
            return Measurement(width, width)
        return super().__rich_measure__(console, options)

    def _natural_width(self, console, options) -> int:
        """The width with every header and cell on one line (Rich's own measure, given all the room)."""
        return _RichTable.__rich_measure__(self, console, options.update_width(1 << 20)).maximum

    def _frame_width(self, n: int) -> int:
        """Borders and padding of ``n`` columns (as :meth:`rich.table.Table._extra_width` and its padding)."""
        edges = 2 if (self.box and self.show_edge) else 0
        rules = (n - 1) if self.box else 0
        _, right, _, left = self.padding
        pads = n * (left + right) - (0 if self.pad_edge else left + right)
        return edges + rules + pads

    @staticmethod
    def _header_width(column, *, whole: bool) -> int:
        from rich.text import Text

        header = column.header if isinstance(column.header, Text) else Text.from_markup(str(column.header))
        if whole:
            return max((len(line) for line in header.plain.splitlines()), default=0)
        return max((len(word) for word in header.plain.split()), default=0)

    @staticmethod
    def _cells_width(column, console, options) -> int:
        from rich.measure import Measurement
        from rich.text import Text

        width = 0
        for cell in column._cells:
            if isinstance(cell, str):
                cell = Text.from_markup(cell)
            if isinstance(cell, Text):
                w = max((len(line) for line in cell.plain.splitlines()), default=0) if cell.plain else 0
            else:
                w = Measurement.get(console, options, cell).maximum
            width = max(width, w)
        return width

    def _fitted(self, console, options):
        """A copy with headers wrapped and the fewest columns dropped to fit ``options.max_width``."""
        import copy

        need = [max(self._header_width(c, whole=False), self._cells_width(c, console, options))
                for c in self.columns]
        headers = [str(c.header) for c in self.columns]
        order = [h for h in self.drop_first if h in headers[1:]]
        order += [h for h in reversed(headers[1:]) if h not in order]
        kept = list(range(len(self.columns)))
        dropped: list[str] = []
        while len(kept) > 1 and self._frame_width(len(kept)) + sum(need[i] for i in kept) > options.max_width:
            name = order.pop(0)
            kept.remove(headers.index(name))
            dropped.append(name)
        table = copy.copy(self)
        table.columns = []
        for i in kept:
            column = copy.copy(self.columns[i])
            column.width = need[i]
            column.min_width = None
            column.no_wrap = False
            column.overflow = "fold"  # only when even the first column alone is too wide: wrapped, never cut
            table.columns.append(column)
        table.min_width = None
        return table, [d for d in headers if d in dropped]
