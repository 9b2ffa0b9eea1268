"""The sweep's progress line moves with trial-steps, not finished trials: a breadth-first study finishes no
trial until one reaches the goal, so a line of finished trials stood still for minutes while its estimate
climbed. Unit tests of the progress objects, fed events as the sweep's workers send them."""

from __future__ import annotations

import io
import re
import time

from edps_mlflow.progress import StudyProgress, SweepProgress, SweepStudy, guess_steps_to_result
from edps_mlflow.results import StudyReport

CURVE = "digits-simple-cnn sgd 0"


def _sweep() -> SweepProgress:
    """Batch size 1,024 already done (80 steps), 256, 64 and 16 to train with 32 trials each."""
    studies = [SweepStudy("bs=1024", CURVE, 1024, 0, 5000, 80)]
    studies += [SweepStudy(f"bs={b}", CURVE, b, 32, 5000) for b in (256, 64, 16)]
    progress = SweepProgress(4, 1, 96, io.StringIO(), studies=studies)
    progress.started = time.monotonic() - 100.0  # 100 s into the sweep: a known rate
    return progress


def _minutes_left(line: str) -> float:
    return float(re.search(r"~([0-9.]+) min left", line).group(1))


def test_guess_of_steps_to_result_from_the_nearest_measured_batch_size() -> None:
    assert guess_steps_to_result(256, 5000, {}) is None
    assert guess_steps_to_result(256, 5000, {1024: 80}) == 160  # sqrt(1024 / 256) = 2 times the steps
    assert guess_steps_to_result(2048, 5000, {1024: 80}) == 80  # larger: the steps of the plateau
    assert guess_steps_to_result(16, 5000, {1024: 80, 256: 200}) == 800  # the nearer one, 256
    assert guess_steps_to_result(2, 500, {1024: 80}) == 500  # never beyond the cap


def test_sweep_line_moves_with_the_running_trials_steps_while_no_trial_finishes() -> None:
    progress = _sweep()
    # Before any steps: the estimate rests on the study already done (32 x 160 + 32 x 320 + 32 x 640).
    assert progress.trial_steps_to_go() == 35840
    progress.study_steps("bs=256", 3200, 100)
    first = progress.line()
    assert "studies 1/4 done" in first and "bs=256 at step 100" in first
    assert "trial-steps 3,200, ~32,640 to go (est.)" in first
    assert abs(_minutes_left(first) - 32640 / 32 / 60) < 0.2  # 3,200 trial-steps in 100 s
    # No trial has finished, yet the line moves. Its trials passed the guess of 160 steps: now guessed at
    # sqrt(2) x 200 = 283 steps, so 32 x 283 - 6,400 = 2,656 to go for bs=256.
    progress.study_steps("bs=256", 6400, 200)
    second = progress.line()
    assert "bs=256 at step 200" in second and "trial-steps 6,400, ~33,376 to go (est.)" in second
    assert _minutes_left(second) < _minutes_left(first)
    assert progress.trials_done == 0 and "| trials 0/96 |" in second  # no trial has finished
    # The study finishes at 200 steps: the smaller batch sizes are guessed from it, the nearest result.
    progress.finished_study(StudyReport("k256", 200, skipped=False), "bs=256")
    third = progress.line()
    assert "studies 2/4 done, 0 running" in third and "at step" not in third
    assert "trial-steps 6,400, ~38,400 to go (est.)" in third  # 32 x 400 + 32 x 800
    assert abs(_minutes_left(third) - 38400 / 64 / 60) < 0.2


def test_sweep_line_without_a_result_yet_says_when_the_estimate_comes() -> None:
    studies = [SweepStudy(f"bs={b}", CURVE, b, 8, 1000) for b in (256, 16)]
    progress = SweepProgress(2, 0, 16, io.StringIO(), studies=studies)
    progress.study_steps("bs=256", 800, 100)
    line = progress.line()
    assert "bs=256 at step 100" in line and "trial-steps 800 |" in line and "after the first result" in line


def test_executors_without_steps_fall_back_to_finished_trials() -> None:
    progress = SweepProgress(2, 0, 16, io.StringIO(), studies=[SweepStudy("bs=16", CURVE, 16, 16, 1000)])
    progress.trials_done = 4  # as the MLflow Projects executor counts them from the store
    assert "trials 4/16" in progress.line() and "trial-steps" not in progress.line()


def test_study_progress_reports_trial_steps_throttled_and_at_every_finished_trial() -> None:
    heard: list[tuple[int, int]] = []
    progress = StudyProgress(3, stream=io.StringIO(), on_steps=lambda s, f: heard.append((s, f)),
                             steps_interval=1000.0)
    for index in range(3):
        progress.trial_started(index)
    progress.check(0, 20, 0.5)
    progress.check(1, 20, 0.4)  # within the interval: not reported
    progress.check(2, 20, 0.3)
    assert heard == [(20, 20)]
    progress.check(0, 40, 0.2)
    progress.trial_finished(0, "reached", 40, steps_trained=40)  # forced: 40 + 20 + 20
    assert heard[-1] == (80, 40)
    progress.trial_finished(1, "superseded", None)  # no steps_trained: its last check counts
    assert heard[-1] == (80, 40) and progress.trial_steps == 80
