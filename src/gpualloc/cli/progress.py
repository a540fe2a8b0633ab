"""The CLI's one progress display (:func:`gpualloc.cli.common.progress_bar` makes it): a live Rich bar on a
terminal, plain lines every few seconds elsewhere."""

from __future__ import annotations

import threading

from rich.progress import Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text


class CountColumn(TextColumn):
    """done/total and the unit; done alone (and the unit) when the total is unknown."""

    def __init__(self, unit: str) -> None:
        super().__init__("")
        self.unit = unit

    def render(self, task) -> Text:
        total = "" if task.total is None else f"/{task.total:,.0f}"
        return Text(f"{task.completed:,.0f}{total}{self.unit}")


class LoggedProgress(Progress):
    """Rich's ``Progress`` with done/total, elapsed and ETA columns after ``columns``; when ``console`` is not a
    terminal, no live display but :meth:`line` printed every ``log_every_s`` seconds (by a timer thread, so a
    long silent step still shows it is alive) and once at the end if any line was printed."""

    def __init__(self, *columns, unit: str, console, transient: bool, log_every_s: float, get_time=None) -> None:
        self.unit = f" {unit}" if unit else ""
        self.live_bar = console.is_terminal
        # a long speed window: runs that finish a minute apart still give an estimate
        super().__init__(*columns, CountColumn(self.unit), TimeElapsedColumn(), TimeRemainingColumn(),
                         console=console, transient=transient, disable=not self.live_bar,
                         speed_estimate_period=3600.0, get_time=get_time)
        self.log_every_s = log_every_s
        self._last_line = self.get_time()
        self.lines = 0
        self._done: set = set()  # tasks whose last line said done: nothing more to say about them
        self._quit = threading.Event()
        self._timer: threading.Thread | None = None

    def start(self) -> None:
        super().start()
        if not self.live_bar and self._timer is None:
            self._timer = threading.Thread(target=self._beat, name="progress-lines", daemon=True)
            self._timer.start()

    def stop(self) -> None:
        self._quit.set()
        if self._timer is not None:
            self._timer.join()
            self._timer = None
        super().stop()
        if not self.live_bar and self.lines:
            self._log(force=True)

    def add_task(self, description: str, *args, **kwargs):
        kwargs.setdefault("note", "")
        return super().add_task(description, *args, **kwargs)

    def update(self, task_id, **kwargs) -> None:
        super().update(task_id, **kwargs)
        self._log()

    def advance(self, task_id, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log()

    def _beat(self) -> None:
        while not self._quit.wait(self.log_every_s):
            self._log()

    def _log(self, force: bool = False) -> None:
        if self.live_bar:
            return
        now = self.get_time()
        if not force and now - self._last_line < self.log_every_s:
            return
        self._last_line = now
        for task in self.tasks:
            if task.visible and task.id not in self._done:
                self.console.print(Text(self.line(task)), highlight=False, soft_wrap=True)
                self.lines += 1
                if task.finished:
                    self._done.add(task.id)

    def line(self, task) -> str:
        """One task's progress as a plain line; the time left is from the average rate since it started."""
        elapsed = task.elapsed or 0.0
        done, total = task.completed, task.total
        text = f"{task.description}: {done:,.0f}"
        text += f"/{total:,.0f}{self.unit} ({done / total:.0%})" if total else self.unit
        text += f", {clock(elapsed)} elapsed"
        if total and done >= total:
            text += ", done"
        elif total and done > 0:
            text += f", about {clock(elapsed * (total - done) / done)} left"
        note = task.fields.get("note")
        return f"{text}; {note}" if note else text


def clock(seconds: float) -> str:
    """``h:mm:ss``."""
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
