"""Progress of a study: one live line on a terminal, plain periodic lines in logs."""

from __future__ import annotations

import sys
import time
from typing import TextIO


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
