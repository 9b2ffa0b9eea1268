"""Progress of a study and of a sweep: one line updated in place on a terminal, a line at most every
``interval`` seconds in a log."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Callable, Sequence, TextIO

from edps_mlflow.results import StudyReport


class _Line:
    """A progress line written to ``stream`` at most every ``interval`` seconds (unless forced)."""

    def __init__(self, stream: TextIO, live_interval: float, log_interval: float) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.interval = live_interval if self.live else log_interval
        self._last = 0.0
        self.started = time.monotonic()

    def _due(self, force: bool) -> bool:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return False
        self._last = now
        return True

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def close(self) -> None:
        if self.live:
            self._write("\n")


class StudyProgress(_Line):
    """Tracks chunks, steps and the best validation error."""

    def __init__(self, to_train: int, stream: TextIO | None = None, log_interval: float = 10.0,
                 on_trial: Callable[[str, int | None], None] | None = None,
                 on_steps: Callable[[int, int], None] | None = None, steps_interval: float = 1.0) -> None:
        super().__init__(stream or sys.stdout, 0.2, log_interval)
        self.to_train = to_train
        self.finished = 0
        self.training: dict[int, int] = {}  # trial index -> latest step
        self.best_validation_error: float | None = None
        self.best_steps: int | None = None
        self.on_trial = on_trial  # told of every finished trial (a sweep worker forwards it to the sweep)
        # Told (trial-steps so far, furthest step) at most every steps_interval s and at every finished trial:
        # a breadth-first study finishes no trial until one reaches, so a sweep's progress comes from steps.
        self.on_steps = on_steps
        self.steps_interval = steps_interval
        self.finished_steps = 0  # trial-steps of the finished trials
        self.furthest_step = 0
        self._last_steps = -math.inf  # the first check reports at once

    def trial_started(self, index: int) -> None:
        self.training[index] = 0
        self._render()

    def check(self, index: int, step: int, validation_error: float | None) -> None:
        self.training[index] = step
        self.furthest_step = max(self.furthest_step, step)
        self._report_steps()
        if validation_error is not None and (self.best_validation_error is None
                                             or validation_error < self.best_validation_error):
            self.best_validation_error = validation_error
        self._render()

    def trial_finished(self, index: int, status: str, steps_to_result: int | None,
                       steps_trained: int | None = None) -> None:
        if self.on_trial is not None:
            self.on_trial(status, steps_to_result)
        last_check = self.training.pop(index, 0)
        self.finished_steps += steps_trained if steps_trained is not None else last_check
        self._report_steps(force=True)
        self.finished += 1
        if steps_to_result is not None and (self.best_steps is None or steps_to_result < self.best_steps):
            self.best_steps = steps_to_result
        self._render(force=True, event=f"trial {index} {status}"
                     + (f" at step {steps_to_result}" if steps_to_result is not None else ""))

    @property
    def trial_steps(self) -> int:
        """Trial-steps trained so far: the finished trials' steps and the running ones' last checks."""
        return self.finished_steps + sum(self.training.values())

    def _report_steps(self, force: bool = False) -> None:
        if self.on_steps is None:
            return
        now = time.monotonic()
        if not force and now - self._last_steps < self.steps_interval:
            return
        self._last_steps = now
        self.on_steps(self.trial_steps, self.furthest_step)

    def _line(self) -> str:
        best = f"{self.best_validation_error:.4f}" if self.best_validation_error is not None else "-"
        result = str(self.best_steps) if self.best_steps is not None else "-"
        steps = ",".join(f"{i}@{s}" for i, s in sorted(self.training.items())[:6])
        more = "..." if len(self.training) > 6 else ""
        return (f"[{time.monotonic() - self.started:6.1f}s] trials {self.finished}/{self.to_train} done, "
                f"{len(self.training)} training ({steps}{more}) | best val error {best} | "
                f"steps-to-result so far {result}")

    def _render(self, force: bool = False, event: str | None = None) -> None:
        if not self._due(force):
            return
        if self.live:
            self._write("\r\x1b[2K" + ((f"{event}; " if event else "") + self._line())[:200])
        else:
            self._write((f"{event}: " if event else "") + self._line() + "\n")


@dataclass(frozen=True)
class SweepStudy:
    """One study of a sweep, as its progress line and estimate see it."""

    label: str
    curve: str  # the studies of one curve (workload, optimizer, sparsity) share it
    batch_size: int
    trials: int  # trials still to train (0 for a study already done)
    max_steps: int
    steps_to_result: int | None = None  # known for a study already done


def guess_steps_to_result(batch_size: int, max_steps: int, known: dict[int, int]) -> int | None:
    """A rough guess of a study's steps-to-result from the nearest measured batch size B' of its curve: at a
    larger batch size the same steps (the plateau), at a smaller one S(B') sqrt(B'/B), halfway in log between
    the plateau and perfect scaling; never beyond the cap. None when nothing is measured yet."""
    if not known:
        return None
    nearest = min(known, key=lambda b: (abs(math.log2(b / batch_size)), b))
    steps = known[nearest] * (math.sqrt(nearest / batch_size) if batch_size < nearest else 1.0)
    return min(max_steps, max(1, round(steps)))


class SweepProgress(_Line):
    """Studies done / running / to do, the running studies' steps, trial-steps trained against an estimate of
    the trial-steps still to go, and from their rate the time left. Trial-steps, not finished trials, measure a
    breadth-first study's progress; the executors that report no steps (Ray, MLflow Projects) fall back to
    finished trials. The estimate of a study still to train is its trials x :func:`guess_steps_to_result`
    (sqrt(2) times its furthest step once its trials passed that guess): rough, refined as studies finish."""

    def __init__(self, total: int, done: int, trials_to_train: int, out: TextIO, interval: float = 30.0,
                 studies: Sequence[SweepStudy] = (), on_study: Callable[[StudyReport], None] | None = None) -> None:
        super().__init__(out, 0.5, interval)
        self.on_study = on_study  # told of every finished study (the sweep charts its curves)
        self.total, self.done, self.trials_to_train = total, done, trials_to_train
        self.running = 0
        self.failed = 0  # studies that ended without a result (the mlflow-project executor goes on after one)
        self.trials_done = 0
        self.best: dict[str, int] = {}  # study label -> best steps-to-result so far
        self.studies = {study.label: study for study in studies}
        self.results: dict[str, dict[int, int]] = {}  # curve -> batch size -> steps-to-result measured
        for study in studies:
            if study.steps_to_result is not None:
                self.results.setdefault(study.curve, {})[study.batch_size] = study.steps_to_result
        self.unfinished = {study.label for study in studies if study.trials > 0}
        self.steps: dict[str, tuple[int, int]] = {}  # running study -> (trial-steps, furthest step)
        self.finished_trial_steps = 0  # trial-steps of the studies finished in this sweep

    def started_study(self) -> None:
        self.running += 1
        self.render()

    def trial_finished(self, label: str, steps_to_result: int | None) -> None:
        """A trial of a running study ended (workers report each one)."""
        self.trials_done += 1
        if steps_to_result is not None and steps_to_result < self.best.get(label, steps_to_result + 1):
            self.best[label] = steps_to_result
        self.render()

    def study_steps(self, label: str, trial_steps: int, furthest_step: int) -> None:
        """A running study has trained ``trial_steps`` in all, its furthest trial is at ``furthest_step``."""
        self.steps[label] = (trial_steps, furthest_step)
        self.render()

    def finished_study(self, report: StudyReport, label: str) -> None:
        self.running = max(0, self.running - 1)
        self.done += 1
        self.best.pop(label, None)
        self.finished_trial_steps += self.steps.pop(label, (0, 0))[0]
        self.unfinished.discard(label)
        study = self.studies.get(label)
        if study is not None and report.steps_to_result is not None:
            self.results.setdefault(study.curve, {})[study.batch_size] = report.steps_to_result
        if self.on_study is not None:
            self.on_study(report)
        result = report.steps_to_result if report.steps_to_result is not None else "no result"
        self.render(force=True, event=f"{label}: steps_to_result {result}"
                    + (" (already done)" if report.skipped else ""))

    def failed_study(self, text: str) -> None:
        """A study ended without a result (its lines say why); the sweep goes on with the others."""
        self.running = max(0, self.running - 1)
        self.failed += 1
        self.render(force=True, event=text)

    @property
    def trial_steps_done(self) -> int:
        return self.finished_trial_steps + sum(steps for steps, _ in self.steps.values())

    def trial_steps_to_go(self) -> int | None:
        """The estimate of the trial-steps the unfinished studies still train; None without a guess."""
        if not self.studies:
            return None
        left = 0
        for label in self.unfinished:
            study = self.studies[label]
            trained, furthest = self.steps.get(label, (0, 0))
            guess = guess_steps_to_result(study.batch_size, study.max_steps, self.results.get(study.curve)
                                          or {b: s for curve in self.results.values() for b, s in curve.items()})
            if guess is None:
                return None
            if furthest >= guess:  # not reached where guessed: its result lies beyond, half a doubling on
                guess = math.ceil(furthest * math.sqrt(2))
            left += max(0, study.trials * min(study.max_steps, guess) - trained)
        return left

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        remaining = self.total - self.done
        failed = f", {self.failed} failed" if self.failed else ""
        head = (f"[{elapsed:7.1f}s] studies {self.done}/{self.total} done, {self.running} running, "
                f"{max(0, remaining - self.running - self.failed)} to do{failed}")
        best = ", ".join(f"{label} {steps}" for label, steps in list(self.best.items())[:3])
        tail = f" | best so far: {best}" if best else ""
        if not self.steps and not self.finished_trial_steps:
            return head + " | " + self._trials_part(elapsed) + tail
        done = self.trial_steps_done
        rate = done / elapsed if elapsed > 0 else 0.0
        to_go = self.trial_steps_to_go()
        if to_go is None:
            estimate = ""
            eta = "time left: after the first result" if not self.results else "time left: unknown"
        else:
            estimate = f", ~{to_go:,} to go (est.)"
            eta = f"~{to_go / rate / 60:.1f} min left" if rate > 0 else "time left: after the first steps"
        running = ", ".join(f"{label} at step {furthest}"
                            for label, (_, furthest) in sorted(self.steps.items(), key=lambda item: item[0])[:3])
        return (head + (f" ({running})" if running else "") + f" | trials {self.trials_done}/{self.trials_to_train}"
                f" | trial-steps {done:,}{estimate} | {rate:,.0f} trial-steps/s | {eta}" + tail)

    def _trials_part(self, elapsed: float) -> str:
        """Executors that report finished trials only: their count and rate."""
        rate = self.trials_done / elapsed if elapsed > 0 else 0.0
        left = max(0, self.trials_to_train - self.trials_done)
        eta = f"~{left / rate / 60:.1f} min left" if self.trials_done and rate else "time left: after the first trial"
        return f"trials {self.trials_done}/{self.trials_to_train} | {rate:.2f} trials/s | {eta}"

    def render(self, force: bool = False, event: str | None = None) -> None:
        if not self._due(force):
            return
        if self.live:
            self._write("\r\x1b[2K" + (event + "\n" if event else "") + self.line()[:200])
        else:
            self._write((f"{event}\n" if event else "") + self.line() + "\n")
