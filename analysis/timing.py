"""Time-to-result: steps-to-result turned into hours on the device the studies were measured on, and a
projection for data parallelism over N such devices (docs/time-to-result.md states the model in full).

For a curve (workload, optimizer, sparsity, protocol), at a measured batch size B and N devices:

    hours_N(B) = S(B) x [ t(ceil(B / N)) + A_N ] / 3600
    A_N        = 2 (N - 1) / N x P / bandwidth + 2 (N - 1) x latency       (A_1 = 0)

- S(B): the study's steps-to-result.
- t(b): training seconds per step at batch b on one measured device: each study's best trial's measured
  time (checks, evaluation and probes excluded). At a measured batch size it is the measurement itself;
  between two measured batch sizes, log t is linear in log b (a power law through the two neighbours);
  below the smallest or above the largest measured batch size there is no projection (the row says so):
  per-step time there is dominated by fixed overheads or memory limits that no fit of the measured points
  knows. The slowest device sets the pace, so an uneven split uses ceil(B / N).
- A_N: a bandwidth-optimal ring all-reduce of the gradients (Patarasuk & Yuan 2009): each device sends and
  receives 2 (N - 1) / N of the P gradient bytes (every parameter, pruned or not: the dense gradient) in
  2 (N - 1) messages, each paying the latency once. No overlap of communication with computation.

This module works on the study table only (no MLflow, no torch): the measured seconds, the device and the
network's size are columns that ``analysis.load`` reads from the study runs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from edps_mlflow.errors import EdpsError

GIGABYTE = 1e9  # bandwidths are in GB/s (10^9 bytes per second), as interconnects are quoted
MICROSECOND = 1e-6
DEFAULT_BANDWIDTH_GB_S = 10.0
DEFAULT_LATENCY_US = 10.0
DEFAULT_DEVICES = (1, 2, 4, 8)
SECONDS_PER_HOUR = 3600.0

TIME_COLUMNS = ("batch_size", "devices", "per_device_batch", "steps_to_result", "compute_seconds_per_step",
                "allreduce_seconds_per_step", "seconds_per_step", "hours", "device", "pack_size", "note")


@dataclass(frozen=True)
class CostModel:
    """The interconnect of the projection and the device counts to project for."""

    bandwidth: float = DEFAULT_BANDWIDTH_GB_S * GIGABYTE  # bytes per second through each device's link
    latency: float = DEFAULT_LATENCY_US * MICROSECOND  # seconds per message
    devices: tuple[int, ...] = DEFAULT_DEVICES

    def __post_init__(self) -> None:
        if isinstance(self.bandwidth, bool) or not isinstance(self.bandwidth, (int, float)) \
                or not math.isfinite(self.bandwidth) or self.bandwidth <= 0:
            raise EdpsError(f"bandwidth must be a finite positive number, got {self.bandwidth!r}")
        if isinstance(self.latency, bool) or not isinstance(self.latency, (int, float)) \
                or not math.isfinite(self.latency) or self.latency < 0:
            raise EdpsError(f"latency must be a finite number >= 0, got {self.latency!r}")
        if not self.devices:
            raise EdpsError("name at least one device count")
        for count in self.devices:
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise EdpsError(f"device counts must be positive integers, got {count!r}")
        if len(set(self.devices)) != len(self.devices):
            raise EdpsError(f"device counts must differ, got {', '.join(map(str, self.devices))}")

    def allreduce_seconds(self, devices: int, parameter_bytes: float) -> float:
        """Seconds of one ring all-reduce of ``parameter_bytes`` over ``devices`` (0 on one device)."""
        if devices == 1:
            return 0.0
        return 2 * (devices - 1) / devices * parameter_bytes / self.bandwidth + 2 * (devices - 1) * self.latency

    def describe(self) -> str:
        return (f"ring all-reduce of the gradients at {self.bandwidth / GIGABYTE:g} GB/s and "
                f"{self.latency / MICROSECOND:g} us per message, per-device batch ceil(B/N), no overlap")


# Units of a time for people, by magnitude: (name, hours per unit, shown below this many hours).
_DURATION_UNITS = (("s", 1 / 3600, 1 / 60), ("min", 1 / 60, 1.0), ("h", 1.0, 48.0), ("days", 24.0, math.inf))


def duration_unit(hours: float) -> tuple[str, float]:
    """The unit (name, hours per unit) in which ``hours`` reads best: s, min, h or days."""
    for name, per_unit, below in _DURATION_UNITS:
        if abs(hours) < below:
            return name, per_unit
    return _DURATION_UNITS[-1][:2]


def duration_words(hours: float | None) -> str:
    """A time in hours as people read it, its unit chosen by magnitude: ``0.585 s``, ``12.3 min``, ``5.2 h``,
    ``3.1 days`` ("-" when there is none). Tables for programs (CSV, JSON) keep the raw ``hours``."""
    if hours is None or pd.isna(hours) or not math.isfinite(float(hours)):
        return "-"
    name, per_unit = duration_unit(float(hours))
    return f"{float(hours) / per_unit:.3g} {name}"


def parse_devices(text: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` -> (1, 2, 4, 8); anything else is one EdpsError line."""
    parts = [part.strip() for part in text.split(",")]
    counts = []
    for part in parts:
        if not re.fullmatch(r"[0-9]{1,9}", part) or int(part) < 1:
            raise EdpsError(f"--devices must be positive integers separated by commas, got {text!r}")
        counts.append(int(part))
    if len(set(counts)) != len(counts):
        raise EdpsError(f"--devices must name each count once, got {text!r}")
    return tuple(counts)


def step_seconds(batch_sizes: np.ndarray, seconds: np.ndarray, batch: float) -> float | None:
    """Training seconds per step at ``batch`` from measurements at ``batch_sizes``: the measurement itself, or
    log-log linear interpolation between the two neighbours; None outside the measured range."""
    order = np.argsort(batch_sizes)
    b, t = np.asarray(batch_sizes, dtype=float)[order], np.asarray(seconds, dtype=float)[order]
    if not len(b) or batch < b[0] or batch > b[-1]:
        return None
    exact = np.flatnonzero(b == batch)
    if len(exact):
        return float(np.median(t[exact]))  # one study per batch size in a curve; a median if there are more
    above = int(np.searchsorted(b, batch))
    low, high = above - 1, above
    weight = (math.log(batch) - math.log(b[low])) / (math.log(b[high]) - math.log(b[low]))
    return float(math.exp((1 - weight) * math.log(t[low]) + weight * math.log(t[high])))


def _one_value(values: pd.Series) -> float | None:
    numbers = pd.to_numeric(values, errors="coerce").dropna()
    return float(numbers.iloc[-1]) if len(numbers) else None


def time_table(studies: pd.DataFrame, model: CostModel) -> pd.DataFrame:
    """One row per curve, measured batch size (with a steps-to-result) and device count."""
    if "seconds_per_step" not in studies.columns or pd.to_numeric(studies["seconds_per_step"],
                                                                     errors="coerce").notna().sum() == 0:
        raise EdpsError("no study records its training seconds per step (studies run before they were "
                        "recorded, or a CSV without a seconds_per_step column): nothing to turn into time")
    from analysis.regimes import curve_columns, curves

    columns = curve_columns(studies)
    rows = []
    for key, curve in curves(studies).items():
        head = dict(zip(columns, key))
        seconds = pd.to_numeric(curve["seconds_per_step"], errors="coerce")
        timed = curve[seconds.notna() & (seconds > 0)]
        b_timed = timed["batch_size"].to_numpy(dtype=float)
        t_timed = pd.to_numeric(timed["seconds_per_step"]).to_numpy(dtype=float)
        parameter_bytes = _one_value(curve.get("model_parameter_bytes", pd.Series(dtype=float)))
        devices = sorted({str(d) for d in curve.get("device", pd.Series(dtype=object)).dropna()})
        packs = pd.to_numeric(curve.get("pack_size", pd.Series(dtype=float)), errors="coerce").dropna()
        curve_notes = []
        if len(devices) > 1:
            curve_notes.append(f"timed on {len(devices)} different devices")
        if len(packs) and packs.max() > 1:
            curve_notes.append(f"timed in packs of up to {packs.max():.3g} trials: each trial's share of a lockstep "
                               f"step, which may differ from a lone trial's step either way")
        largest_pack = float(packs.max()) if len(packs) else None
        device_names = ", ".join(devices) if devices else None
        compute_at: dict[int, float | None] = {}  # per-device batch -> seconds per step: a curve asks often
        for steps, batch in zip(curve["steps_to_result"].to_numpy(), curve["batch_size"].to_numpy()):
            if steps is None or not np.isfinite(float(steps)):
                continue
            batch = int(batch)
            for count in model.devices:
                per_device = math.ceil(batch / count)
                if per_device not in compute_at:
                    compute_at[per_device] = step_seconds(b_timed, t_timed, per_device)
                compute = compute_at[per_device]
                notes = list(curve_notes)
                allreduce: float | None = model.allreduce_seconds(count, 0.0) if count == 1 else None
                if count > 1 and parameter_bytes is None:
                    notes.append("the model's size is not recorded: no projection over devices")
                elif count > 1:
                    allreduce = model.allreduce_seconds(count, parameter_bytes)
                if compute is None:
                    notes.append(f"per-device batch {per_device} outside the timed batch sizes "
                                 f"{_range(b_timed)}: not projected")
                total = compute + allreduce if compute is not None and allreduce is not None else None
                rows.append({**head, "batch_size": batch, "devices": count, "per_device_batch": per_device,
                             "steps_to_result": float(steps), "compute_seconds_per_step": compute,
                             "allreduce_seconds_per_step": allreduce, "seconds_per_step": total,
                             "hours": float(steps) * total / SECONDS_PER_HOUR if total is not None else None,
                             "device": device_names, "pack_size": largest_pack, "note": "; ".join(notes)})
    if not rows:
        raise EdpsError("no study with a steps-to-result: no time-to-result to compute")
    table = pd.DataFrame(rows)
    ordered = list(columns) + [c for c in TIME_COLUMNS if c not in columns]
    return table[ordered]


def _range(batch_sizes: np.ndarray) -> str:
    if not len(batch_sizes):
        return "(none)"
    return f"{int(batch_sizes.min())}-{int(batch_sizes.max())}"


def fastest_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per curve and device count: the measured batch size with the least time-to-result, its hours, and the
    speed-up over the fastest batch size on one device. A minimum at the edge of the measured batch sizes
    may lie beyond them; the note says so."""
    keys = [c for c in table.columns if c not in TIME_COLUMNS]
    rows = []
    for key, group in table.groupby(keys + ["devices"], sort=True, dropna=False):
        head = dict(zip(keys + ["devices"], key))
        projected = group.dropna(subset=["hours"])
        if projected.empty:
            rows.append({**head, "batch_size": None, "hours": None, "steps_to_result": None,
                         "per_device_batch": None, "speedup_over_one_device": None,
                         "note": "no batch size could be projected"})
            continue
        best = projected.loc[projected["hours"].idxmin()]
        note = "the only batch size that could be projected" if len(projected) == 1 else ""
        if len(projected) > 1 and best["batch_size"] == projected["batch_size"].max():
            note = "fastest at the largest projected batch size: a larger one may be faster still"
        elif len(projected) > 1 and best["batch_size"] == projected["batch_size"].min():
            note = "fastest at the smallest projected batch size: a smaller one may be faster still"
        rows.append({**head, "batch_size": int(best["batch_size"]), "hours": best["hours"],
                     "steps_to_result": best["steps_to_result"], "per_device_batch": int(best["per_device_batch"]),
                     "speedup_over_one_device": None, "note": note})
    fastest = pd.DataFrame(rows)
    on_one = {tuple(str(row[k]) for k in keys): row["hours"] for _, row in fastest.iterrows() if row["devices"] == 1}
    for position, row in fastest.iterrows():
        base = on_one.get(tuple(str(row[k]) for k in keys))
        if base is not None and pd.notna(base) and pd.notna(row["hours"]) and row["hours"] > 0:
            fastest.at[position, "speedup_over_one_device"] = float(base) / float(row["hours"])
    return fastest
