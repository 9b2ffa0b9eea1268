"""MLflow search filters, built by one function that quotes every key and value.

MLflow's search parser strips a value's enclosing quotes and unescapes nothing, so a value goes in single
quotes, or double quotes when it holds a single quote; one holding both cannot be written and is refused.
Keys go in backticks. No MLflow import, so the training side and the analysis share it.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from edps_mlflow.errors import EdpsError


def quote_value(value: str) -> str:
    """``value`` as a string literal of MLflow's search syntax."""
    text = str(value)
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    raise EdpsError(f"cannot search the tracking store for {text!r}: MLflow's search syntax cannot express a "
                    "value that holds both a single and a double quote")


def quote_key(key: str) -> str:
    """``key`` as an identifier of MLflow's search syntax."""
    if "`" in key or not key:
        raise EdpsError(f"cannot search the tracking store for the name {key!r}: it is empty or holds a backtick")
    return f"`{key}`"


def filter_string(tags: Mapping[str, str] | None = None, status: str | None = None,
                  metrics_above: Mapping[str, float] | None = None, tags_absent: Sequence[str] = (),
                  tags_present: Sequence[str] = (), tags_not: Mapping[str, Sequence[str]] | None = None,
                  run_ids: Sequence[str] = (), run_name: str | None = None,
                  started_from: int | None = None, ended_from: int | None = None,
                  started_before: int | None = None) -> str:
    """Runs whose tags equal ``tags``, whose status is ``status`` and whose metrics exceed ``metrics_above``;
    that lack every tag of ``tags_absent`` and carry every tag of ``tags_present``; whose tag ``k`` of
    ``tags_not`` is set to none of its values (a run without the tag does not match); whose id is one of
    ``run_ids``; named ``run_name``; started, or ended, at or after these times (ms); started before
    ``started_before`` (ms).

    A condition on a tag's value makes the store look at that tag of every run; conditions on the run's own
    attributes (status, id, name, times) do not: the cheap searches of a large store use only those.

    >>> filter_string(tags={"edps.kind": "study", "edps.workload": "it's"}, status="FINISHED")
    'tags.`edps.kind` = \\'study\\' and tags.`edps.workload` = "it\\'s" and attributes.status = \\'FINISHED\\''
    >>> filter_string(tags={"edps.kind": "trial"}, tags_absent=["edps.trial_key"])
    "tags.`edps.kind` = 'trial' and tags.`edps.trial_key` IS NULL"
    """
    conditions = [f"tags.{quote_key(key)} = {quote_value(value)}" for key, value in (tags or {}).items()]
    conditions += [f"tags.{quote_key(key)} IS NULL" for key in tags_absent]
    conditions += [f"tags.{quote_key(key)} IS NOT NULL" for key in tags_present]
    conditions += [f"tags.{quote_key(key)} != {quote_value(value)}" for key, values in (tags_not or {}).items()
                   for value in values]
    if status is not None:
        conditions.append(f"attributes.status = {quote_value(status)}")
    if run_ids:
        conditions.append(f"attributes.run_id IN ({', '.join(quote_value(run_id) for run_id in run_ids)})")
    if run_name is not None:
        conditions.append(f"attributes.run_name = {quote_value(run_name)}")
    for attribute, bound in (("start_time", started_from), ("end_time", ended_from)):
        if bound is not None:
            conditions.append(f"attributes.{attribute} >= {int(bound)}")
    if started_before is not None:
        conditions.append(f"attributes.start_time < {int(started_before)}")
    for key, bound in (metrics_above or {}).items():
        if not math.isfinite(bound):
            raise ValueError(f"a metric bound must be finite, got {bound!r}")
        # sqlparse splits ``1e+300`` at the sign, so exponents are written without one.
        conditions.append(f"metrics.{quote_key(key)} > {float(bound)!r}".replace("e+", "e"))
    return " and ".join(conditions)
