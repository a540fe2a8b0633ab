"""The one progress display: a live bar on a terminal; plain lines with the time left every few seconds
when stderr is redirected, a last line at the end, and silence for a short run."""

from __future__ import annotations

import io
import time

from rich.console import Console

from gpualloc.cli.common import progress_bar


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _log_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=400), out


def test_redirected_output_gets_a_line_every_interval_with_the_time_left():
    console, out = _log_console()
    clock = Clock()
    with progress_bar(unit="jobs", console=console, get_time=clock, log_every_s=10.0) as bar:
        task = bar.add_task("simulate fcfs", total=1000)
        clock.now += 4
        bar.update(task, completed=100)  # 4 s in: not yet a line
        assert out.getvalue() == ""
        clock.now += 16
        bar.update(task, completed=400)  # 20 s in, 400 of 1000: 30 s left at this rate
        clock.now += 20
        bar.advance(task, 600)
    lines = out.getvalue().splitlines()
    assert lines == ["simulate fcfs: 400/1,000 jobs (40%), 0:00:20 elapsed, about 0:00:30 left",
                     "simulate fcfs: 1,000/1,000 jobs (100%), 0:00:40 elapsed, done"]


def test_a_short_run_prints_nothing_when_redirected():
    console, out = _log_console()
    clock = Clock()
    with progress_bar(unit="runs", console=console, get_time=clock) as bar:
        task = bar.add_task("table", total=3)
        for _ in range(3):
            clock.now += 1
            bar.advance(task)
    assert out.getvalue() == ""


def test_unknown_totals_and_notes():
    console, out = _log_console()
    clock = Clock()
    with progress_bar(unit="stages", console=console, get_time=clock) as bar:
        task = bar.add_task("train scheduler", total=None)
        clock.now += 11
        bar.update(task, advance=1, note="teacher: gavel-srtf")
    assert out.getvalue().splitlines()[0] == "train scheduler: 1 stages, 0:00:11 elapsed; teacher: gavel-srtf"


def test_a_silent_step_still_prints_lines_when_redirected():
    console, out = _log_console()
    with progress_bar(console=console, log_every_s=0.05) as bar:
        bar.add_task("cloning", total=10)
        deadline = time.monotonic() + 10
        while bar.lines < 2 and time.monotonic() < deadline:  # the work reports nothing meanwhile
            time.sleep(0.05)
    assert len(out.getvalue().splitlines()) >= 2
    assert out.getvalue().splitlines()[0].startswith("cloning: 0/10 (0%), 0:00:00 elapsed")


def test_a_terminal_gets_the_live_bar_with_an_estimate():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    clock = Clock()
    with progress_bar(unit="jobs", console=console, get_time=clock, transient=False) as bar:
        task = bar.add_task("fcfs", total=100)
        clock.now += 5
        bar.update(task, completed=50, refresh=True)
    text = out.getvalue()
    assert "50/100 jobs" in text or "100/100 jobs" in text
    assert "0:00:05" in text  # remaining at 10 jobs a second, or elapsed
