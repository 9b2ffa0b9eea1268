"""Prune a freshly initialised network with a registered method: its scores computed here or found in the
score cache (cache.py), then its cut at the trial's sparsity. At sparsity 0 nothing is scored: the mask is
dense whatever the method (such a study's method is ``snip``, so one dense study serves every method).
"""

from __future__ import annotations

import time

from torch import Tensor

from edps_mlflow.pruning import METHODS, get_method
from edps_mlflow.pruning.base import Method, ScoreContext, Shapes, parameter_shapes
from edps_mlflow.pruning.cache import ScoreCache, score_key
from edps_mlflow.pruning.mask import Mask, dense_mask
from edps_mlflow.results import PruningRecord, ScoreSource


def prune_at_initialisation(method_name: str, context: ScoreContext, data_fingerprint: str | None = None,
                            cache: ScoreCache | None = None) -> tuple[Mask, PruningRecord]:
    """The trial's mask and how it was made. The cache is used for a method whose scores are costly
    (``MethodInfo.cached``) when the data's fingerprint is known; the mask is the same either way."""
    method = get_method(method_name)
    if context.sparsity == 0.0:
        return dense_mask(context.model), PruningRecord(ScoreSource.NONE)
    shapes = parameter_shapes(context.model)
    scorer = METHODS[method.scorer]
    started = time.perf_counter()
    computing_seconds = None
    if cache is None or data_fingerprint is None or not scorer.cached:
        scores = method.scores(context)
    else:
        key = score_key(context.workload.name, data_fingerprint, scorer.name, context.init_seed, shapes,
                        context.sparsity if scorer.sparsity_dependent else None)
        scores, computing_seconds = _cached_scores(method, context, shapes, cache, key, started)
    seconds = time.perf_counter() - started
    record = (PruningRecord(ScoreSource.COMPUTED, seconds) if computing_seconds is None
              else PruningRecord(ScoreSource.CACHED, seconds, computing_seconds - seconds))
    return method.mask(scores, shapes, context.sparsity, context.init_seed), record


def _cached_scores(method: Method, context: ScoreContext, shapes: Shapes, cache: ScoreCache, key: str,
                   started: float) -> tuple[dict[str, Tensor], float | None]:
    """The scores from the cache with the seconds their computation took, or computed here and kept (None)."""
    prunable = {name: shapes[name] for name in method.prunable(shapes)}
    found = cache.load(key, prunable)
    if found is None:
        with cache.computing(key):
            found = cache.load(key, prunable)  # another process may have computed it while this one waited
            if found is None:
                scores = method.scores(context)
                cache.store(key, scores, time.perf_counter() - started)
                return scores, None
    return found
