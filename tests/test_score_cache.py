"""Score once, prune anywhere (edps_mlflow/pruning/cache.py): a trial's pruning scores are computed once per
(data, method, initialisation) and every mask derived from them is the one computed afresh, bit for bit."""

from __future__ import annotations

from dataclasses import replace

import torch

from edps_mlflow.config import StudySpec, TrialSpec
from edps_mlflow.data.fingerprint import splits_fingerprint
from edps_mlflow.models import init_fan_in_truncated_normal
from edps_mlflow.pruning.cache import ENVIRONMENT, ScoreCache, default_score_cache
from edps_mlflow.pruning.snip import snip_mask
from edps_mlflow.results import ScoreSource, pruning_summary
from edps_mlflow.trials import prepare_trial

from helpers import DIGITS, digits_data


def _spec(pruning: str = "snip", sparsity: float = 0.9, batch_size: int = 64, optimizer: str = "sgd") -> StudySpec:
    spec = StudySpec.build("digits-simple-cnn", optimizer, sparsity, batch_size, pruning=pruning)
    return replace(spec, data_fingerprint=splits_fingerprint(digits_data()))


def _trial(spec: StudySpec, index: int = 2) -> TrialSpec:
    return TrialSpec(spec, index, {"learning_rate": 0.1, "momentum": 0.9} if spec.optimizer != "sgd"
                     else {"learning_rate": 0.1})


def test_masks_from_kept_scores_are_snips_masks_bit_for_bit(tmp_path):
    data, cache = digits_data(), ScoreCache(tmp_path)
    for sparsity in (0.9, 0.5):
        trial = _trial(_spec(sparsity=sparsity))
        model = DIGITS.build_model()
        init_fan_in_truncated_normal(model, torch.Generator().manual_seed(trial.init_seed))
        legacy = snip_mask(model, data.train_images, data.train_labels, sparsity, DIGITS.loss)
        setups = [prepare_trial(DIGITS, data, trial, cache), prepare_trial(DIGITS, data, trial, cache)]
        if sparsity == 0.9:
            setups.append(prepare_trial(DIGITS, data, trial))  # no cache: computed afresh
        for setup in setups:
            assert all(torch.equal(setup.mask.tensors[n], legacy.tensors[n]) for n in legacy.tensors)
            assert all(torch.equal(setup.initial_parameters[n], setups[0].initial_parameters[n]) for n in legacy.tensors)
        # One computation for both sparsities: SNIP's scores do not depend on the sparsity.
        expected = [ScoreSource.COMPUTED if sparsity == 0.9 else ScoreSource.CACHED, ScoreSource.CACHED]
        assert [s.pruning.source for s in setups[:2]] == expected


def test_one_computation_serves_every_batch_size_optimizer_and_sparsity(tmp_path):
    data, cache = digits_data(), ScoreCache(tmp_path)
    records = [prepare_trial(DIGITS, data, _trial(_spec("grasp", s, b, o)), cache).pruning
               for s in (0.5, 0.9) for b in (16, 256) for o in ("sgd", "momentum")]
    assert [r.source for r in records] == [ScoreSource.COMPUTED] + [ScoreSource.CACHED] * 7
    summary = pruning_summary(records)
    assert summary["computed"] == 1 and summary["cached"] == 7 and summary["seconds_saved"] > 0
    assert all(r.seconds < records[0].seconds for r in records[1:])
    # Another initialisation, another entry; a shuffle uses its method's scores.
    assert prepare_trial(DIGITS, data, _trial(_spec("grasp"), 3), cache).pruning.source is ScoreSource.COMPUTED
    assert prepare_trial(DIGITS, data, _trial(_spec("shuffle(grasp)")), cache).pruning.source is ScoreSource.CACHED
    # SynFlow's schedule ends at the sparsity: kept per sparsity, shared by batch sizes and optimizers.
    synflow = [prepare_trial(DIGITS, data, _trial(_spec("synflow", s, b)), cache).pruning.source
               for s, b in ((0.9, 16), (0.9, 256), (0.5, 16))]
    assert synflow == [ScoreSource.COMPUTED, ScoreSource.CACHED, ScoreSource.COMPUTED]
    # Data-free methods whose scores cost nothing are not kept; the dense network is not scored at all.
    assert prepare_trial(DIGITS, data, _trial(_spec("random")), cache).pruning.source is ScoreSource.COMPUTED
    assert prepare_trial(DIGITS, data, _trial(_spec(sparsity=0.0)), cache).pruning.source is ScoreSource.NONE


def test_other_data_or_an_unreadable_entry_is_computed_again(tmp_path):
    data, cache = digits_data(), ScoreCache(tmp_path)
    trial = _trial(_spec())
    prepare_trial(DIGITS, data, trial, cache)
    other = replace(trial.study, data_fingerprint="0" * 64)
    assert prepare_trial(DIGITS, data, _trial(other), cache).pruning.source is ScoreSource.COMPUTED
    # A spec without a data fingerprint (no study set it) is never looked up.
    unknown = replace(trial.study, data_fingerprint=None)
    assert prepare_trial(DIGITS, data, _trial(unknown), cache).pruning.source is ScoreSource.COMPUTED
    for entry in tmp_path.rglob("*.npz"):
        entry.write_bytes(b"not a zip file")
    setup = prepare_trial(DIGITS, data, trial, cache)
    assert setup.pruning.source is ScoreSource.COMPUTED
    assert all(torch.equal(setup.mask.tensors[n], t) for n, t in prepare_trial(DIGITS, data, trial).mask.tensors.items())
    assert prepare_trial(DIGITS, data, trial, cache).pruning.source is ScoreSource.CACHED


def test_where_the_cache_lives(monkeypatch, tmp_path):
    monkeypatch.setenv(ENVIRONMENT, "off")
    assert default_score_cache() is None
    monkeypatch.setenv(ENVIRONMENT, str(tmp_path / "scores"))
    assert default_score_cache() == str(tmp_path / "scores")
    monkeypatch.delenv(ENVIRONMENT)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_score_cache() == str(tmp_path / "edps-mlflow" / "pruning-scores")
