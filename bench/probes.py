"""Cost of one probe call for Simple-CNN on MNIST-shaped data. Prints seconds per call; not a test.

    python bench/probes.py [--train-size 54000] [--trials 1]

The Lipschitz probe makes ten passes over the whole training split per call (one before the
update, nine after); the noise-scale probe one pass over 1,024 examples.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edps_mlflow.resources import configure_training_process, training_environment_missing  # noqa: E402

if training_environment_missing(os.environ):  # allocator settings are read when a process starts
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **training_environment_missing(os.environ)})

import torch  # noqa: E402

from edps_mlflow.models import SimpleCNN, init_fan_in_truncated_normal  # noqa: E402
from edps_mlflow.probes import LipschitzProbe, NoiseScaleProbe, ProbeContext  # noqa: E402
from edps_mlflow.workloads import cross_entropy  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--train-size", type=int, default=54_000)
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    configure_training_process(device.type, args.threads)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(args.train_size, 1, 28, 28, generator=generator).to(device)
    labels = torch.randint(0, 10, (args.train_size,), generator=generator).to(device)
    model = SimpleCNN()
    init_fan_in_truncated_normal(model, generator)
    model.to(device)
    params = {n: p.detach().unsqueeze(0).repeat(args.trials, *([1] * p.dim())) for n, p in model.named_parameters()}
    current = dict(params)
    context = ProbeContext(model, lambda: current, None, images, labels, step=1000, seed=0, loss=cross_entropy)
    for probe in (NoiseScaleProbe(), LipschitzProbe()):
        started = time.perf_counter()
        probe.before_step(context)
        for name in current:
            current[name] = params[name] * 0.999  # stands in for one update
        probe.after_step(context)
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        print(f"{probe.name}: {elapsed:.2f} s per call ({args.trials} trial(s), {args.train_size} training examples, "
              f"{device}, {torch.get_num_threads()} thread(s))", flush=True)
        current = dict(params)


if __name__ == "__main__":
    main()
