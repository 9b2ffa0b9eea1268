"""The identity of a steps-to-result curve: the study fields a curve is measured at, all but the batch size.

Every part that groups studies into curves asks ``CurveId`` (status, the neighbour hint, the adaptive sweep, the
analysis), so a new axis of the science is one more field here with the tag it is stored under (and its
StudySpec field and tag written by tracking): no part can then merge two curves that differ in it. A run written
before an axis existed lacks its tag and is read at the field's default. Pure: no torch, no MLflow.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from edps_mlflow.names import TAG_OPTIMIZER, TAG_PARAMETERIZATION, TAG_PRUNING, TAG_SPARSITY, TAG_WORKLOAD
from edps_mlflow.parameterization import Parameterization
from edps_mlflow.pruning import DEFAULT_METHOD


@dataclass(frozen=True, order=True)
class CurveId:
    """One curve: every field is a StudySpec field of the same name."""

    workload: str
    optimizer: str
    sparsity: float
    # Last, so that the axes before it keep their positions. At sparsity 0 it is "snip" (StudySpec): the one
    # dense curve that every method's curves are compared with.
    pruning: str = DEFAULT_METHOD
    # After pruning, for the same reason; at sparsity 0 it is "sp" (StudySpec).
    parameterization: str = Parameterization.SP.value

    def __post_init__(self) -> None:
        object.__setattr__(self, "sparsity", float(self.sparsity) + 0.0)  # -0.0 is 0.0, as in StudySpec
        object.__setattr__(self, "parameterization", Parameterization(self.parameterization).value)

    @classmethod
    def of(cls, spec: Any) -> "CurveId":
        """The curve of a study (a StudySpec, or anything with the axes as attributes: a status row)."""
        return cls(**{name: getattr(spec, name) for name in CURVE_AXES})

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> "CurveId":
        """The curve of a table row (a dict or a pandas Series with the :data:`CURVE_AXES` columns)."""
        return cls(**{name: values[name] for name in CURVE_AXES})

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> "CurveId":
        """The curve of a study or trial run, from its tags (KeyError or ValueError: not a run of ours)."""
        return cls(**{name: _read_tag(name, tags) for name in CURVE_AXES})

    def values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in CURVE_AXES)

    def as_dict(self) -> dict[str, Any]:
        return dict(zip(CURVE_AXES, self.values()))

    def within_workload(self) -> dict[str, Any]:
        """The axes that tell this curve from the others of its workload (a sweep's curves share one)."""
        return {name: value for name, value in self.as_dict().items() if name != "workload"}

    def tags(self) -> dict[str, str]:
        """The tags of the curve's runs as tracking writes them, a float as its repr (0.9: "0.9", 0: "0.0")."""
        return {CURVE_TAGS[name]: repr(value) if isinstance(value, float) else str(value)
                for name, value in self.as_dict().items()}

    def search_tags(self) -> dict[str, str]:
        """The tags a search for this curve's runs may filter on: those every run has (compare :meth:`from_tags`
        of what the search finds)."""
        return {tag: text for tag, text in self.tags().items() if tag not in (CURVE_TAGS[n] for n in TAG_DEFAULTS)}

    def label(self) -> str:
        """``nesterov sparsity=0.9 pruning=random``: the curve among those of its workload (progress lines,
        decisions); the dense curve, pruned by nothing, names no method."""
        parts = self.within_workload()
        if self.sparsity == 0.0:
            parts.pop("pruning")
        if self.parameterization == Parameterization.SP.value:
            parts.pop("parameterization")
        return " ".join(str(value) if name == "optimizer" else f"{name}={value:g}" if isinstance(value, float)
                        else f"{name}={value}" for name, value in parts.items())


    def chart_name(self, protocol: Mapping[str, float] | None = None, workload: bool = False) -> str:
        """The curve in a metric's name (names.curve_metric), alike on sweep and analysis runs: ``sgd/sp0.5``, a
        method other than SNIP's after the sparsity (``sgd/sp0.9/random``), then the protocol values that tell the
        run's curves apart (``/goal0.05``); the workload first with ``workload``. SμPar's curves end their axes in
        ``/supar`` (``sgd/sp0.5/supar``)."""
        name = f"{self.optimizer}/sp{self.sparsity:g}" + (f"/{self.pruning}" if self.pruning != DEFAULT_METHOD else "")
        if self.parameterization != Parameterization.SP.value:
            name += f"/{self.parameterization}"
        name += "".join(f"/{key}{value:g}" for key, value in (protocol or {}).items())
        return f"{self.workload}/{name}" if workload else name


CURVE_AXES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(CurveId))
_AXIS_TYPES = {f.name: f.type for f in dataclasses.fields(CurveId)}
# The tag each axis is written under on study and trial runs (tracking writes them; names.py has the names).
CURVE_TAGS: dict[str, str] = {"workload": TAG_WORKLOAD, "optimizer": TAG_OPTIMIZER, "sparsity": TAG_SPARSITY,
                              "pruning": TAG_PRUNING, "parameterization": TAG_PARAMETERIZATION}
# The value a run without an axis' tag was measured at: runs made before pruning methods existed were SNIP's,
# before parameterisations SP's.
TAG_DEFAULTS: dict[str, Any] = {"pruning": DEFAULT_METHOD, "parameterization": Parameterization.SP.value}


def _read_tag(name: str, tags: Mapping[str, str]) -> Any:
    text = tags.get(CURVE_TAGS[name])
    if text is None:
        if name in TAG_DEFAULTS:
            return TAG_DEFAULTS[name]
        raise KeyError(CURVE_TAGS[name])
    return float(text) if _AXIS_TYPES[name] == "float" else text
