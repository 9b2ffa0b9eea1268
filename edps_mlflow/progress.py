"""Progress of a study (one live line on a terminal, plain periodic lines in logs) and of a sweep."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from edps_mlflow.results import StudyReport


class StudyProgress:
    """Tracks chunks, steps and the best validation error; renders at most every ``interval`` s."""

    def __init__(self, total_trials: int, to_train: int, stream: TextIO | None = None,
                 log_interval: float = 10.0) -> None:
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty()
        self.interval = 0.2 if self.live else log_interval
        self.total_trials = total_trials
        self.to_train = to_train
        self.finished = 0
        self.training: dict[int, int] = {}  # trial index -> latest step
        self.best_validation_error: float | None = None
        self.best_steps: int | None = None
        self.started = time.monotonic()
        self._last_render = 0.0

    def trial_started(self, index: int) -> None:
        self.training[index] = 0
        self._render()

    def check(self, index: int, step: int, validation_error: float | None) -> None:
        self.training[index] = step
        if validation_error is not None and (self.best_validation_error is None
                                             or validation_error < self.best_validation_error):
            self.best_validation_error = validation_error
        self._render()

    def trial_finished(self, index: int, status: str, steps_to_result: int | None) -> None:
        self.training.pop(index, None)
        self.finished += 1
        if steps_to_result is not None and (self.best_steps is None or steps_to_result < self.best_steps):
            self.best_steps = steps_to_result
        self._render(force=True, event=f"trial {index} {status}"
                     + (f" at step {steps_to_result}" if steps_to_result is not None else ""))

    def close(self) -> None:
        if self.live:
            self.stream.write("\n")
            self.stream.flush()

    def _line(self) -> str:
        best = f"{self.best_validation_error:.4f}" if self.best_validation_error is not None else "-"
        result = str(self.best_steps) if self.best_steps is not None else "-"
        steps = ",".join(f"{i}@{s}" for i, s in sorted(self.training.items())[:6])
        more = "..." if len(self.training) > 6 else ""
        return (f"[{time.monotonic() - self.started:6.1f}s] trials {self.finished}/{self.to_train} done, "
                f"{len(self.training)} training ({steps}{more}) | best val error {best} | "
                f"steps-to-result so far {result}")

    def _render(self, force: bool = False, event: str | None = None) -> None:
        now = time.monotonic()
        if not force and now - self._last_render < self.interval:
            return
        self._last_render = now
        if self.live:
            text = self._line()
            if event:
                text = f"{event}; {text}"
            self.stream.write("\r\x1b[2K" + text[:200])
        else:
            self.stream.write((f"{event}: " if event else "") + self._line() + "\n")
        self.stream.flush()


class SweepProgress:
    """Studies done / running / to do, trials per second and an estimate of the time left."""

    def __init__(self, total: int, done: int, to_run: int, workers: int, out: TextIO, interval: float) -> None:
        self.total, self.done, self.to_run, self.workers = total, done, to_run, workers
        self.finished_here = 0
        self.running = 0
        self.trials_trained = 0
        self.study_seconds = 0.0
        self.out, self.interval = out, interval
        self.started = time.monotonic()
        self._last = 0.0

    def started_study(self) -> None:
        self.running += 1
        self.render()

    def finished_study(self, report: StudyReport, label: str) -> None:
        self.running = max(0, self.running - 1)
        self.finished_here += 1
        self.done += 1
        self.trials_trained += report.trained
        self.study_seconds += report.seconds
        result = report.steps_to_result if report.steps_to_result is not None else "no result"
        self.render(force=True, event=f"{label}: steps_to_result {result}"
                    + (" (already done)" if report.skipped else ""))

    def render(self, force: bool = False, event: str | None = None) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        elapsed = now - self.started
        remaining = self.total - self.done
        rate = self.trials_trained / elapsed if elapsed > 0 else 0.0
        if self.finished_here:
            eta = self.study_seconds / self.finished_here * remaining / max(1, self.workers)
            eta_text = f"~{eta / 60:.1f} min left"
        else:
            eta_text = "time left unknown yet"
        line = (f"[{elapsed:7.1f}s] studies {self.done}/{self.total} done, {self.running} running, "
                f"{max(0, remaining - self.running)} to do | {rate:.2f} trials/s | {eta_text}")
        print((f"{event}\n" if event else "") + line, file=self.out, flush=True)
