"""Time to result: steps-to-result in hours on the device the studies were timed on, and projected for data
parallelism over N such devices (docs/time-to-result.md states the model and its limits):

    hours_N(B) = S(B) x [ t(ceil(B / N)) + 2 (N - 1) / N x P / bandwidth + 2 (N - 1) x latency ] / 3600

with t(b) the best trial's measured seconds per step, interpolated log-log between timed batch sizes and never
extrapolated, and P the gradient bytes of a ring all-reduce (Patarasuk & Yuan 2009), not overlapped.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.regimes import curve_columns, curves
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
        for name, value, positive in (("bandwidth", self.bandwidth, True), ("latency", self.latency, False)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or (value <= 0 if positive else value < 0):
                raise EdpsError(f"{name} must be a finite {'positive number' if positive else 'number >= 0'}, "
                                f"got {value!r}")
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
    """A time in hours as people read it: ``0.585 s``, ``12.3 min``, ``5.2 h``, ``3.1 days``, or "-"."""
    if hours is None or pd.isna(hours) or not math.isfinite(float(hours)):
        return "-"
    name, per_unit = duration_unit(float(hours))
    return f"{float(hours) / per_unit:.3g} {name}"


def parse_devices(text: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` -> (1, 2, 4, 8); anything else is one EdpsError line."""
    counts = [int(part) if re.fullmatch(r"[0-9]{1,9}", part.strip()) else 0 for part in text.split(",")]
    if min(counts) < 1:
        raise EdpsError(f"--devices must be positive integers separated by commas, got {text!r}")
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


def time_table(studies: pd.DataFrame, model: CostModel) -> pd.DataFrame:
    """One row per curve, measured batch size (with a steps-to-result) and device count."""
    if "seconds_per_step" not in studies.columns or pd.to_numeric(studies["seconds_per_step"],
                                                                     errors="coerce").notna().sum() == 0:
        raise EdpsError("no study records its training seconds per step (studies run before they were "
                        "recorded, or a CSV without a seconds_per_step column): nothing to turn into time")
    columns = curve_columns(studies)
    rows = [row for key, curve in curves(studies).items() for row in _curve_rows(dict(zip(columns, key)), curve, model)]
    if not rows:
        raise EdpsError("no study with a steps-to-result: no time-to-result to compute")
    return pd.DataFrame(rows)[list(columns) + [c for c in TIME_COLUMNS if c not in columns]]


def _curve_rows(head: dict, curve: pd.DataFrame, model: CostModel) -> list[dict]:
    seconds = pd.to_numeric(curve["seconds_per_step"], errors="coerce")
    timed = curve[seconds.notna() & (seconds > 0)]
    b_timed = timed["batch_size"].to_numpy(dtype=float)
    t_timed = pd.to_numeric(timed["seconds_per_step"]).to_numpy(dtype=float)
    sizes = pd.to_numeric(curve.get("model_parameter_bytes", pd.Series(dtype=float)), errors="coerce").dropna()
    parameter_bytes = float(sizes.iloc[-1]) if len(sizes) else None
    devices = sorted({str(d) for d in curve.get("device", pd.Series(dtype=object)).dropna()})
    packs = pd.to_numeric(curve.get("pack_size", pd.Series(dtype=float)), errors="coerce").dropna()
    curve_notes = [f"timed on {len(devices)} different devices"] if len(devices) > 1 else []
    if len(packs) and packs.max() > 1:
        curve_notes.append(f"timed in packs of up to {packs.max():.3g} trials: each trial's share of a lockstep "
                           f"step, which may differ from a lone trial's step either way")
    common = {"device": ", ".join(devices) if devices else None,
              "pack_size": float(packs.max()) if len(packs) else None}
    rows = []
    for steps, batch in zip(curve["steps_to_result"].to_numpy(), curve["batch_size"].to_numpy()):
        if steps is None or not np.isfinite(float(steps)):
            continue
        for count in model.devices:
            per_device = math.ceil(int(batch) / count)
            compute, notes = step_seconds(b_timed, t_timed, per_device), list(curve_notes)
            allreduce: float | None = 0.0 if count == 1 else None
            if count > 1 and parameter_bytes is None:
                notes.append("the model's size is not recorded: no projection over devices")
            elif count > 1:
                allreduce = model.allreduce_seconds(count, parameter_bytes)
            if compute is None:
                timed_range = f"{int(b_timed.min())}-{int(b_timed.max())}" if len(b_timed) else "(none)"
                notes.append(f"per-device batch {per_device} outside the timed batch sizes {timed_range}: "
                             "not projected")
            total = compute + allreduce if compute is not None and allreduce is not None else None
            rows.append({**head, "batch_size": int(batch), "devices": count, "per_device_batch": per_device,
                         "steps_to_result": float(steps), "compute_seconds_per_step": compute,
                         "allreduce_seconds_per_step": allreduce, "seconds_per_step": total,
                         "hours": float(steps) * total / SECONDS_PER_HOUR if total is not None else None,
                         **common, "note": "; ".join(notes)})
    return rows


def fastest_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per curve and device count: the batch size with the least time-to-result, its hours, and the speed-up over
    one device; a minimum at the edge of the measured batch sizes may lie beyond them (the note says so)."""
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
        best, sizes = projected.loc[projected["hours"].idxmin()], projected["batch_size"]
        edge = {sizes.min(): ("smallest", "smaller"), sizes.max(): ("largest", "larger")}.get(best["batch_size"])
        note = ("the only batch size that could be projected" if len(projected) == 1 else "" if edge is None else
                f"fastest at the {edge[0]} projected batch size: a {edge[1]} one may be faster still")
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
