"""The parameterisation a study trains under (docs/parameterization.md): ``sp``, the paper's standard one, or
``supar``, sparse maximal update parameterisation (Dey, Bergsma and Hestness 2024), which rescales each masked
layer's initialisation and learning rate by its density. Names only: the rules are in supar.py (torch)."""

from __future__ import annotations

from enum import Enum

from edps_mlflow.errors import EdpsError


class Parameterization(str, Enum):
    SP = "sp"
    SUPAR = "supar"


PARAMETERIZATIONS: tuple[str, ...] = tuple(p.value for p in Parameterization)


def parse_parameterization(text: "str | Parameterization") -> Parameterization:
    """``sp`` or ``supar`` (any case); anything else is refused in one line."""
    try:
        return Parameterization(str(getattr(text, "value", text)).strip().lower())
    except ValueError:
        raise EdpsError(f"unknown parameterization {text!r}; choose {' or '.join(PARAMETERIZATIONS)}") from None


def parse_parameterizations(text: str) -> tuple[Parameterization, ...]:
    """``sp,supar`` -> the parameterisations in order."""
    return tuple(parse_parameterization(part) for part in text.split(","))
