"""Where training runs and with how much: devices, cores, workers and threads, packing, memory layout,
numerics and the environment of training processes, every such rule in one place (docs/performance.md has
the measurements). No torch at import: the launcher reads :data:`ALLOCATOR_ENVIRONMENT` before torch loads.
"""

from __future__ import annotations

import os
import platform
import re
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edps_mlflow.errors import EdpsError
from edps_mlflow.optimizers import get_optimizer
from edps_mlflow.workloads import InputLayout

if TYPE_CHECKING:
    import torch

# Stop glibc mapping and unmapping every large activation of a step. It reads them when a process starts, so
# whatever launches a training process sets them (the `edps` launcher re-executes itself with them).
ALLOCATOR_ENVIRONMENT: dict[str, str] = {
    "MALLOC_MMAP_THRESHOLD_": "4294967296",
    "MALLOC_TRIM_THRESHOLD_": "68719476736",
    "MALLOC_TOP_PAD_": "1073741824",
}

CHANNELS_LAST_FROM_BATCH = 32  # a loss at tiny batches


def training_environment_missing(environment: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The variables a training process must start with that ``environment`` lacks."""
    missing = {k: v for k, v in ALLOCATOR_ENVIRONMENT.items() if k not in environment}
    if "OMP_NUM_THREADS" not in environment:
        # Read when torch is imported; configure_training_process sets the real count.
        missing["OMP_NUM_THREADS"] = "1"
    return missing


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


_DEVICE = re.compile(r"(cpu|cuda)(?::(\d+))?")


def check_device_name(requested: str | None, indexed: bool = True) -> None:
    """Refuse a device that is not ``cpu``, ``cuda`` or (``indexed``: a study's; a sweep spreads its studies
    over every GPU itself) ``cuda:N``; ``None`` means "cuda when available". The name only, without torch."""
    if requested is None:
        return
    match = _DEVICE.fullmatch(requested)
    if match is None or (match[2] is not None and (not indexed or match[1] != "cuda")):
        raise EdpsError(f"unknown device {requested!r}; use {'cpu, cuda or cuda:N' if indexed else 'cpu or cuda'}")


def device_type(device: str) -> str:
    return device.split(":")[0]


def cuda_devices(requested: str | None, indexed: bool = True) -> int:
    """The one CUDA check: how many CUDA devices a run on ``requested`` may use (``cpu``: 0; ``None``: however
    many there are); an EdpsError when ``cuda`` or ``cuda:N`` is asked for and there is none or no device N."""
    check_device_name(requested, indexed)
    if requested == "cpu":  # cpu:N was refused
        return 0
    count = gpu_count()
    if requested is None:
        return count
    if count == 0:
        raise EdpsError(f"device {requested} requested but no CUDA device is available")
    index = requested.partition(":")[2]
    if index and int(index) >= count:
        raise EdpsError(f"device {requested} requested but there {'is' if count == 1 else 'are'} only {count} "
                        f"CUDA device{'s' if count != 1 else ''}")
    return count


def resolve_device(requested: str | None) -> "torch.device":
    """``None``: cuda when available, else cpu. Anything else must name a usable device."""
    import torch

    gpus = cuda_devices(requested)
    return torch.device(requested if requested is not None else "cuda" if gpus else "cpu")


def describe_device(device: str, threads: int) -> str:
    """The device a training time was measured on: ``cuda:0 (NVIDIA H200)``, or ``cpu (<processor model>, 1
    thread)`` (a CPU's speed depends on its threads)."""
    import torch

    kind = torch.device(device)
    if kind.type == "cuda":
        index = kind.index if kind.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return f"cpu ({_processor_model()}, {threads} thread{'s' if threads != 1 else ''})"


def _processor_model() -> str:
    with suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
        for line in cpuinfo:
            if line.lower().startswith("model name") and ":" in line:
                return " ".join(line.split(":", 1)[1].split())
    return platform.processor() or "unknown model"


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def configure_training_process(device_type: str, threads: int, allow_tf32: bool = False) -> None:
    """On CPU the thread count and flushed denormals (denormal gradients slow a run; flushing is free); FP32
    matmuls and convolutions unless TF32 is allowed (PyTorch allows TF32 convolutions on Ampere and later by
    default; the original measurements ran in full FP32)."""
    import torch

    if device_type == "cpu":
        torch.set_num_threads(threads)
        torch.set_flush_denormal(True)
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32


def choose_pack_size(device_type: str, batch_size: int, trials: int) -> int:
    """How many trials to train in lockstep: on a CPU packing pays up to batch ~4; on a GPU it removes most
    of the launch overhead at small and medium batches."""
    if device_type == "cpu":
        wanted = 32 if batch_size <= 4 else 1
    else:
        wanted = 32 if batch_size <= 128 else 8 if batch_size <= 1024 else 1
    return max(1, min(wanted, trials))


def uses_channels_last(input_layout: InputLayout, batch_size: int) -> bool:
    """Channels-last (a memory format of 4-D tensors) on the single-trial path: for images, from batch 32."""
    return input_layout is InputLayout.IMAGES and batch_size >= CHANNELS_LAST_FROM_BATCH


# The share of the free memory that the trials a breadth-first study keeps alive may hold (the rest is for
# the data, a step's activations and the machine's other processes).
HELD_TRIALS_MEMORY_FRACTION = 0.25


def held_bytes_per_trial(parameter_count: int, optimizer: str, sparse: bool, train_size: int) -> int:
    """What one trial trained breadth-first holds between its turns: float32 parameters, their gradients
    and the initial copy of its setup, the optimizer's state buffers (``Optimizer.state_buffers``), the mask
    (trainer and setup), and its batch stream (up to two epochs of int64 indices)."""
    copies = 3 + get_optimizer(optimizer).state_buffers + 2 * int(sparse)
    return 4 * parameter_count * copies + 2 * 8 * train_size


def available_memory(device: str) -> int:
    """Bytes free on ``device``: the GPU's free memory, or the RAM the kernel calls available."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    with suppress(OSError), open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def breadth_first_fits(held_bytes: int, device: str) -> bool:
    return held_bytes <= HELD_TRIALS_MEMORY_FRACTION * available_memory(device)


@dataclass(frozen=True)
class WorkerLayout:
    """How one study's trials are spread over processes."""

    workers: int  # training processes (1: train in this process)
    threads: int  # CPU threads per training process
    pack_size: int  # trials per chunk, trained in lockstep


def study_layout(device_type: str, batch_size: int, trials_to_train: int, workers: int | None = None,
                 threads: int | None = None, pack_size: int | None = None) -> WorkerLayout:
    """Chunks of packed trials, and on CPU one single-thread worker per core (never more than chunks);
    on a GPU one process."""
    pack = pack_size or choose_pack_size(device_type, batch_size, max(1, trials_to_train))
    chunks = -(-trials_to_train // pack)
    cores = available_cores()
    count = min(workers or cores, max(1, chunks)) if device_type == "cpu" else 1
    return WorkerLayout(workers=count, threads=threads or max(1, cores // count), pack_size=pack)


@dataclass(frozen=True)
class SweepLayout:
    """How a local sweep spreads its studies: one process per GPU (pinned), else per core."""

    devices: tuple[str, ...]
    threads: int  # CPU threads per study process


def sweep_layout(device: str | None, workers: int | None, pending: int) -> SweepLayout:
    gpus = cuda_devices(device, indexed=False)
    if gpus:
        return SweepLayout(tuple(f"cuda:{i}" for i in range(gpus)), 1)
    cores = available_cores()
    count = max(1, min(workers or cores, max(1, pending)))
    return SweepLayout(("cpu",) * count, max(1, cores // count))
