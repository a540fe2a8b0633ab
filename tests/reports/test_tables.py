"""Rich tables never cut a value (issue 35): on a narrow terminal headers wrap, then whole columns are left
out by a declared priority and named; not on a terminal, every column is printed in full."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.reports.scheduling import COLUMNS, DROP_FIRST, policies_table
from gpualloc.reports.tables import Table

ROW = {"policy": "tiresias-long-name", "avg_jct_s": 1750.23 * 3600, "p50_jct_s": 12.5 * 3600,
       "p99_jct_s": 12345.67 * 3600, "avg_queue_s": 7.25 * 3600, "throughput_jobs_per_h": 0.123,
       "utilization": 0.87, "effective_utilization": 0.5, "saturated_utilization": 0.99, "makespan_s": 99999.99 * 3600,
       "avg_slowdown": 6.26, "x_bound": 2.67, "vs_fcfs": -0.75, "hyperscore": 100.001, "preemptions": 12345,
       "sim_wall_s": 1234.5}
VALUES = ["tiresias-long-name", "1750.23", "12.50", "12345.67", "7.25", "0.123", "87%", "50%", "99%", "99999.99",
          "6.26", "2.67", "-75%", "100.001", "12345", "1234.50 s"]


def render(renderable, width: int, terminal: bool) -> str:
    from gpualloc.cli.common import _Console

    buf = io.StringIO()
    console = _Console(file=buf, width=width, force_terminal=terminal, color_system=None, legacy_windows=False)
    console.print(renderable)
    return buf.getvalue()


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("width", [80, 40])
def test_scheduling_table_on_a_narrow_terminal(width):
    out = render(policies_table([ROW], "t", more="--json"), width, terminal=True)
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= width
    note = flat(out)
    m = re.search(r"\((\d+) column\(s\) left out at (\d+) columns: (.*?); see them with --json or a wider terminal\)",
                  note)
    assert m and int(m.group(2)) == width, out
    dropped = m.group(3).split(", ")
    assert len(dropped) == int(m.group(1)) and set(dropped) <= set(COLUMNS)
    assert list(dropped) == [c for c in COLUMNS if c in dropped]  # named in the table's order
    assert dropped == [c for c in COLUMNS if c in DROP_FIRST[:len(dropped)]]  # by the declared priority
    cells = {c: v for c, v in zip(COLUMNS, VALUES, strict=True)}
    for column, value in cells.items():
        if column not in dropped:
            assert value in out, (column, value, out)  # whole, on one line
    assert "policy" not in dropped and "avg JCT h" not in dropped


@pytest.mark.parametrize("width", [80, 40])
def test_scheduling_table_not_on_a_terminal_is_whole(width):
    """Piped to a file: every column, every header unwrapped, whatever the width."""
    out = render(policies_table([ROW], "t", more="--json"), width, terminal=False)
    assert "…" not in out and "left out" not in out
    header = next(line for line in out.splitlines() if "policy" in line)
    for column in COLUMNS:
        assert column in header, (column, header)
    row = next(line for line in out.splitlines() if "tiresias-long-name" in line)
    for value in VALUES:
        assert value in row, (value, row)


def test_wide_enough_terminal_keeps_everything():
    out = render(policies_table([ROW], "t"), 400, terminal=True)
    assert "left out" not in out and all(v in out for v in VALUES)


def test_headers_wrap_before_columns_are_dropped():
    t = Table()
    for h in ("name", "average job completion time", "p99 time"):
        t.add_column(h)
    t.add_row("x", "1.25", "3.50")
    out = render(t, 30, terminal=True)
    assert "left out" not in out and "1.25" in out and "3.50" in out and "completion" in out


WORDS = st.text(alphabet="abcdefgh ", min_size=1, max_size=14).map(lambda s: " ".join(s.split())).filter(bool)
NUMBERS = st.one_of(st.floats(-1e12, 1e12, allow_nan=False).map(lambda x: f"{x:,.2f}"),
                    st.integers(-10**9, 10**9).map(str))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(headers=st.lists(WORDS, min_size=1, max_size=10, unique=True), data=st.data(),
       width=st.integers(20, 200), terminal=st.booleans())
def test_no_value_is_ever_cut(headers, data, width, terminal):
    rows = data.draw(st.lists(st.lists(NUMBERS, min_size=len(headers), max_size=len(headers)), min_size=1,
                              max_size=4))
    t = Table(title="random", drop_first=data.draw(st.permutations(headers)))
    for h in headers:
        t.add_column(h, justify="right")
    for r in rows:
        t.add_row(*r)
    out = render(t, width, terminal)
    assert "…" not in out
    text = flat(out)
    m = re.search(r"left out at \d+ columns: (.*?); see them", text)
    for i, h in enumerate(headers):
        if m and i > 0 and h in _names(m.group(1), headers):
            continue
        for r in rows:
            if len(r[i]) + 4 <= width or not terminal:  # a value wider than the terminal itself folds
                assert r[i] in out, (h, r[i], width, out)


def _names(listed: str, headers: list[str]) -> set[str]:
    """The headers named in a note (names may hold ', ' only if a header does; these don't)."""
    return {h for h in headers if h in listed.split(", ")}


def test_every_rich_table_goes_through_the_helper():
    """One place decides widths: no module builds a plain rich Table."""
    src = Path(__file__).resolve().parents[2] / "src" / "gpualloc"
    offenders = [str(p.relative_to(src)) for p in src.rglob("*.py")
                 if p.name != "tables.py" and re.search(r"from rich\.table import|rich\.table\.Table", p.read_text())]
    assert offenders == []
