"""Engine benchmark: prints ratios measured in one run. Not a test.

    python bench/engine.py                 # everything (the full-trials studies alone take tens of minutes)
    python bench/engine.py --skip-study    # only the step-rate part
    python bench/engine.py --device cuda   # on a GPU machine

Part 1, Simple-CNN (62,346 parameters) on MNIST-shaped random data with a 90% mask and momentum,
batches rotating through a device-resident tensor by index:
  - one trial: the engine's fast path against a plain PyTorch loop (nn.Module in NCHW,
    torch.optim.SGD, the mask re-applied to the weights after each step, same thread count);
  - packed K = 8 and 32 trials in lockstep against K sequential single trials (trial-steps/s).
Part 2, the digits workload (SGD, dense, a check every 20 steps), batch sizes 16, 256 and 1,024 with
8 and 32 trials: trial-steps and wall time of exact early stopping breadth-first (the default) against
depth-first and against full_trials=true, their steps-to-result (which must be equal), and each one's
trial-steps over the lower bound of any exact method (``study/trial_steps_ratio``).

    python bench/engine.py --skip-steps --study-max-steps 1000 --study-trials 8
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edps_mlflow.resources import configure_training_process, training_environment_missing  # noqa: E402  (no torch yet)

if training_environment_missing(os.environ):  # allocator settings are read when a process starts
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **training_environment_missing(os.environ)})

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from edps_mlflow.engine import PackedTrainer, SingleTrainer  # noqa: E402
from edps_mlflow.optimizers import get_optimizer  # noqa: E402
from edps_mlflow.resources import uses_channels_last  # noqa: E402
from edps_mlflow.models import SimpleCNN, init_fan_in_truncated_normal  # noqa: E402
from edps_mlflow.pruning.mask import Mask  # noqa: E402
from edps_mlflow.trials import TrialSetup  # noqa: E402
from edps_mlflow.workloads import get_workload  # noqa: E402

# Its network is SimpleCNN() (MNIST-shaped); the engine asks the workload for its loss and input layout.
MNIST = get_workload("mnist-simple-cnn")


def _setup(index: int, sparsity: float = 0.9) -> TrialSetup:
    model = SimpleCNN()
    init_fan_in_truncated_normal(model, torch.Generator().manual_seed(index))
    generator = torch.Generator().manual_seed(1000 + index)
    mask = Mask({n: (torch.rand(p.shape, generator=generator) >= sparsity).float() for n, p in model.named_parameters()})
    params = {n: p.detach() * mask.tensors[n] for n, p in model.named_parameters()}
    return TrialSetup(index, params, mask, get_optimizer("momentum").trial({"learning_rate": 0.01, "momentum": 0.9}))


def _rate(step, batches: list[tuple[torch.Tensor, torch.Tensor]], budget: float, device: torch.device) -> float:
    """Steps per second, rotating through ``batches``, for at least ``budget`` seconds (>= 3 steps)."""
    step(*batches[0])
    if device.type == "cuda":
        torch.cuda.synchronize()
    count, started = 0, time.perf_counter()
    while True:
        step(*batches[count % len(batches)])
        count += 1
        if device.type == "cuda" and count % 10 == 0:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        if count >= 3 and elapsed >= budget:
            if device.type == "cuda":
                torch.cuda.synchronize()
                elapsed = time.perf_counter() - started
            return count / elapsed


def step_rates(device: torch.device, batch_sizes: list[int], budget: float, pack_sizes: list[int],
               pack_limit: int) -> None:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(8192, 1, 28, 28, generator=generator).to(device)
    labels = torch.randint(0, 10, (8192,), generator=generator).to(device)
    print(f"device {device}, threads {torch.get_num_threads()}, Simple-CNN, 90% mask, momentum")
    print(f"{'batch':>6} {'plain steps/s':>14} {'engine steps/s':>15} {'engine/plain':>13}   "
          + "  ".join(f"{'packed K=' + str(k) + ' /seq':>17}" for k in pack_sizes))
    for batch_size in batch_sizes:
        order = torch.randperm(8192, generator=generator).to(device)
        batches = [(images[order[i:i + batch_size]], labels[order[i:i + batch_size]])
                   for i in range(0, 8192 - batch_size + 1, batch_size)][:16]

        # The plain loop a careful user would write.
        setup = _setup(0)
        model = SimpleCNN().to(device)
        model.load_state_dict(setup.initial_parameters)
        masks = [setup.mask.tensors[n].to(device) for n, _ in model.named_parameters()]
        params = list(model.parameters())
        optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9)

        def plain_step(x: torch.Tensor, y: torch.Tensor) -> None:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                torch._foreach_mul_(params, masks)

        plain = _rate(plain_step, batches, budget, device)
        engine = SingleTrainer(MNIST, _setup(0), device,
                               channels_last=uses_channels_last(MNIST.input_layout, batch_size))
        single = _rate(lambda x, y: engine.step(x, y, None), batches, budget, device)
        cells = []
        for k in pack_sizes:
            if k * batch_size > pack_limit:
                cells.append(f"{'skipped':>17}")
                continue
            packed = PackedTrainer(MNIST, [_setup(i) for i in range(k)], device)
            rate = _rate(lambda x, y: packed.step(x, y, None), batches, budget, device)
            cells.append(f"{rate * k / single:>16.2f}x")
        print(f"{batch_size:>6} {plain:>14.1f} {single:>15.1f} {single / plain:>12.2f}x   " + "  ".join(cells),
              flush=True)


_MODES = {  # bench name -> (full_trials, schedule)
    "breadth": (False, "breadth_first"),
    "depth": (False, "depth_first"),
    "full": (True, "breadth_first"),
}


def study_times(device: str | None, batch_sizes: list[int], trial_counts: list[int], modes: list[str],
                max_steps: int | None, workers: int, check_interval: int, threads: int) -> None:
    """Digits studies (SGD, dense) per batch size and trial count: trial-steps and wall time of each mode,
    and the ratio of trial-steps to the lower bound of an exact method (results.trial_steps_lower_bound)."""
    from edps_mlflow.config import Schedule, StudySpec
    from edps_mlflow.results import trial_steps_lower_bound
    from edps_mlflow.study import ExecutionOptions, run_study
    from edps_mlflow.workloads import get_workload

    workload = get_workload("digits-simple-cnn")
    print(f"digits studies, SGD, dense, check every {check_interval} steps, cap {max_steps or workload.max_steps}, "
          f"{workers} trial worker(s); ratio = trial-steps / lower bound")
    print(f"{'batch':>6} {'trials':>6} {'mode':>8} {'steps_to_result':>15} {'trial-steps':>11} {'ratio':>6} "
          f"{'wall s':>7}")
    with tempfile.TemporaryDirectory() as directory:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{directory}/mlflow.db"
        for batch_size in batch_sizes:
            for trials in trial_counts:
                spec = StudySpec("digits-simple-cnn", "sgd", 0.0, batch_size, trials, workload.goal_error,
                                 max_steps or workload.max_steps, check_interval, 0)
                for mode in modes:
                    full, schedule = _MODES[mode]
                    # One experiment per study and mode: nothing is reused, and no neighbour orders the trials.
                    options = ExecutionOptions(full_trials=full, device=device, workers=workers, threads=threads,
                                               log_interval=1e9, schedule=Schedule(schedule),
                                               experiment=f"bench/{batch_size}/{trials}/{mode}")
                    started = time.perf_counter()
                    outcome = run_study(spec, options, out=open(os.devnull, "w"))
                    seconds = time.perf_counter() - started
                    ratio = outcome.trial_steps / max(1, trial_steps_lower_bound(outcome.records))
                    print(f"{batch_size:>6} {trials:>6} {mode:>8} {str(outcome.steps_to_result):>15} "
                          f"{outcome.trial_steps:>11} {ratio:>6.2f} {seconds:>7.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-sizes", default="2,16,128,1024")
    parser.add_argument("--pack-sizes", default="8,32")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--pack-limit", type=int, default=8192, help="skip packs with K x batch above this")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-study", action="store_true")
    parser.add_argument("--study-batch-sizes", default="16,256,1024")
    parser.add_argument("--study-trials", default="8,32")
    parser.add_argument("--study-modes", default="breadth,depth,full", help="any of breadth, depth, full")
    parser.add_argument("--study-max-steps", type=int, default=None, help="default: the workload's cap")
    parser.add_argument("--study-workers", type=int, default=1, help="trial workers inside a study")
    parser.add_argument("--study-check-interval", type=int, default=20)
    parser.add_argument("--skip-steps", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    configure_training_process(device.type, args.threads)
    if not args.skip_steps:
        step_rates(device, [int(b) for b in args.batch_sizes.split(",")], args.budget,
                   [int(k) for k in args.pack_sizes.split(",")], args.pack_limit)
    if not args.skip_study:
        study_times(args.device, [int(b) for b in args.study_batch_sizes.split(",")],
                    [int(t) for t in args.study_trials.split(",")], args.study_modes.split(","),
                    args.study_max_steps, args.study_workers, args.study_check_interval, args.threads)


if __name__ == "__main__":
    main()
