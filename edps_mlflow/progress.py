"""Progress of a study (one live line on a terminal, plain periodic lines in logs) and of a sweep."""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from edps_mlflow.results import StudyReport


class StudyProgress:
    """Tracks chunks, steps and the best validation error; renders at most every ``interval`` s."""

    def __init__(self, total_trials: int, to_train: int, stream: TextIO | None = None,
                 log_interval: float = 10.0, on_trial: Callable[[str, int | None], None] | None = None) -> None:
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
        self.on_trial = on_trial  # told of every finished trial (a sweep worker forwards it to the sweep)

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
        if self.on_trial is not None:
            self.on_trial(status, steps_to_result)
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
    """Studies done / running / to do, trials done of all the sweep still has to train, trials per second
    and an estimate of the time left from the trial rate. On a terminal one line updates in place; in a
    log a line at most every ``interval`` seconds (and one per finished study)."""

    def __init__(self, total: int, done: int, trials_to_train: int, workers: int, out: TextIO,
                 interval: float = 30.0) -> None:
        self.total, self.done, self.trials_to_train, self.workers = total, done, trials_to_train, workers
        self.running = 0
        self.failed = 0  # studies that ended without a result (the mlflow-project executor goes on after one)
        self.trials_done = 0
        self.best: dict[str, int] = {}  # study label -> best steps-to-result so far
        self.out = out
        self.live = out.isatty()
        self.interval = 0.5 if self.live else interval
        self.started = time.monotonic()
        self._last = 0.0

    def started_study(self) -> None:
        self.running += 1
        self.render()

    def trial_finished(self, label: str, steps_to_result: int | None) -> None:
        """A trial of a running study ended (workers report each one)."""
        self.trials_done += 1
        if steps_to_result is not None and steps_to_result < self.best.get(label, steps_to_result + 1):
            self.best[label] = steps_to_result
        self.render()

    def finished_study(self, report: StudyReport, label: str) -> None:
        self.running = max(0, self.running - 1)
        self.done += 1
        self.best.pop(label, None)
        result = report.steps_to_result if report.steps_to_result is not None else "no result"
        self.render(force=True, event=f"{label}: steps_to_result {result}"
                    + (" (already done)" if report.skipped else ""))

    def failed_study(self, text: str) -> None:
        """A study ended without a result (its lines say why); the sweep goes on with the others."""
        self.running = max(0, self.running - 1)
        self.failed += 1
        self.render(force=True, event=text)

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        remaining = self.total - self.done
        rate = self.trials_done / elapsed if elapsed > 0 else 0.0
        left = max(0, self.trials_to_train - self.trials_done)
        if self.trials_done and rate > 0:
            eta_text = f"~{left / rate / 60:.1f} min left"
        else:
            eta_text = "time left: after the first trial"
        best = ", ".join(f"{label} {steps}" for label, steps in list(self.best.items())[:3])
        failed = f", {self.failed} failed" if self.failed else ""
        return (f"[{elapsed:7.1f}s] studies {self.done}/{self.total} done, {self.running} running, "
                f"{max(0, remaining - self.running - self.failed)} to do{failed} | trials {self.trials_done}/{self.trials_to_train} | "
                f"{rate:.2f} trials/s | {eta_text}" + (f" | best so far: {best}" if best else ""))

    def render(self, force: bool = False, event: str | None = None) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        if self.live:
            text = ("\r\x1b[2K" + event + "\n" if event else "\r\x1b[2K") + self.line()[:200]
            self.out.write(text)
            self.out.flush()
        else:
            print((f"{event}\n" if event else "") + self.line(), file=self.out, flush=True)

    def close(self) -> None:
        if self.live:
            self.out.write("\n")
            self.out.flush()
