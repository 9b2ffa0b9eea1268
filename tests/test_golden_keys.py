"""Golden keys: the study, trial, result, family and sweep keys of canonical specs, pinned to the hashes the
code computed when they were recorded.

A key finds a measurement again in the store; a key that changes makes every stored study of that spec
invisible, and the next sweep trains it again (a week of work for the paper's workloads). Any change to
StudySpec, its key fields, content_key or the sweep keys must keep these exact strings. If one of them has to
change on purpose (results changed: see RESULTS_VERSION), the store is re-keyed by that change, and the new
hashes are recorded here in the same commit, with the reason.

The early-stopping mode (``--full-trials``) is not part of any key: the store tells the two modes apart by a
tag on the study run, so the keys below serve both modes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from edps_mlflow.adaptive import AdaptiveSettings, Budget, Goal
from edps_mlflow.adaptive_sweep import AdaptiveSweepSpec
from edps_mlflow.config import StudySpec, TrialSpec
from edps_mlflow.sweep import SweepSpec
from edps_mlflow.config import study_family

FINGERPRINT = "0123456789abcdef" * 4
DIGITS, MNIST = "digits-simple-cnn", "mnist-simple-cnn"


def _studies() -> dict[str, StudySpec]:
    return {
        "digits sgd dense": StudySpec.build(DIGITS, "sgd", 0.0, 64),
        "digits momentum 0.9": StudySpec.build(DIGITS, "momentum", 0.9, 128),
        "digits nesterov 0.9 probes best": StudySpec.build(DIGITS, "nesterov", 0.9, 32,
                                                           probes=("lipschitz", "noise_scale")),
        "digits nesterov 0.9 probes all": StudySpec.build(DIGITS, "nesterov", 0.9, 32, probes=("lipschitz",),
                                                          probe_trials="all"),
        "digits sgd fingerprint tf32": replace(StudySpec.build(DIGITS, "sgd", 0.0, 2, allow_tf32=True),
                                               data_fingerprint=FINGERPRINT),
        "mnist sgd dense": StudySpec.build(MNIST, "sgd", 0.0, 256),
        "mnist momentum 0.9 fingerprint": replace(StudySpec.build(MNIST, "momentum", 0.9, 1024),
                                                  data_fingerprint=FINGERPRINT),
        "mnist nesterov 0.9 explicit": StudySpec(MNIST, "nesterov", 0.9, 512, 10, 0.02, 40000, 100, 7),
    }


# name -> (study key, result key, study family)
GOLDEN_STUDIES = {
    "digits sgd dense": (
        "d0a08df269d694d764506c7e205265b26a315df1e14769d79c045c831a6d1af9",
        "d0a08df269d694d764506c7e205265b26a315df1e14769d79c045c831a6d1af9",
        "d7fa7c7ef563d3f5818964907d6eabbf38c4ee82b440dea38d463beb89475dc6"),
    "digits momentum 0.9": (
        "f0bf00d5ffce4d72b1ea23fad930007f5583b0be4cbfb117e24d6f4c52d064af",
        "f0bf00d5ffce4d72b1ea23fad930007f5583b0be4cbfb117e24d6f4c52d064af",
        "4bf26a5ea8a6e5002538aba416fa507947437750965c689cc3c88493c316067d"),
    "digits nesterov 0.9 probes best": (
        "1465437663780ed0377adf945b4dd71112e1c36917cf0b598207eb0566bfb3d7",
        "496ccc5fd2811e234b5bc020c24f39d31aba29949ae08701bf6103b5bbaf33cd",
        "38ec06f50d0f8122e481277c57aed1d18fe662507f381052a21bf6035ce628fd"),
    "digits nesterov 0.9 probes all": (
        "fa81aacc813bb15c3ec2578d2d3d9266d2c0974e87b0004e2110e13356e6a862",
        "496ccc5fd2811e234b5bc020c24f39d31aba29949ae08701bf6103b5bbaf33cd",
        "ddcc55dfe027afbead2586e6900191f1696022dcfac9564c1813ed8b3ebcec5e"),
    "digits sgd fingerprint tf32": (
        "b922a45a0fedfe758c1f1bd7da82ae44947afe18d0270e1464eaa4d183cd0eae",
        "b922a45a0fedfe758c1f1bd7da82ae44947afe18d0270e1464eaa4d183cd0eae",
        "e4ca345317ed2c7c6d7a4e52b77e0114747ec900f19dc107f9a355d4c33da139"),
    "mnist sgd dense": (
        "f64bdba711e55cf3da31734ec56f23da534767ea8f2e938b371de5c86f1a9000",
        "f64bdba711e55cf3da31734ec56f23da534767ea8f2e938b371de5c86f1a9000",
        "b7b5c99354a9b0db91baea0ab56f31c4d9cfa34be66ce134fb200082f3931465"),
    "mnist momentum 0.9 fingerprint": (
        "3a9f2806f5d78c95cadc7b41d96a9c9005361a4b1a2667ead8b53975965900fe",
        "3a9f2806f5d78c95cadc7b41d96a9c9005361a4b1a2667ead8b53975965900fe",
        "d4a5f80e30ab48e4f6375b6df14ae6e5d0cd28b1332e78143dfe54754db48683"),
    "mnist nesterov 0.9 explicit": (
        "8069f86436fe69dc5cea09cffbd1b10b40047f2fde6ffb15e90ece7acc960fb2",
        "8069f86436fe69dc5cea09cffbd1b10b40047f2fde6ffb15e90ece7acc960fb2",
        "7eb478f7862dca765d845fd3dc8091dc2b68ca934b9dd9909d507a8b1f634387"),
}

# study name -> (trial 3's metaparameters, its trial key)
GOLDEN_TRIALS = {
    "digits sgd dense": ({"learning_rate": 0.1},
                         "c92d92ab568e5a45647191c37841ed18f1a97a6fc11d87fee3785de153fe9c2a"),
    "digits momentum 0.9": ({"learning_rate": 0.05, "momentum": 0.9},
                            "4213d970dde60325724c10743d8783baab6c7a5a66e2544143519d097e3c7896"),
    "mnist nesterov 0.9 explicit": ({"learning_rate": 0.01, "momentum": 0.99},
                                    "49cb1f6d1fcafa2dade4f5bb50857617a95e7aeb16772a1feec57ece26945c17"),
    "digits nesterov 0.9 probes best": ({"learning_rate": 0.2, "momentum": 0.5},
                                        "bb71f297f1643c7eb9b83b64e6082a5d1b7aec07fb972ba0d1c2f587d41e3520"),
}


def _grid() -> SweepSpec:
    return SweepSpec.build(DIGITS, ("sgd", "momentum"), (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), (0.0, 0.9))


@pytest.mark.parametrize("name", sorted(GOLDEN_STUDIES))
def test_study_keys_are_the_recorded_ones(name):
    spec = _studies()[name]
    study_key, result_key, family = GOLDEN_STUDIES[name]
    assert (spec.study_key, spec.result_key, study_family(spec)) == (study_key, result_key, family), \
        f"the keys of {name!r} changed: every stored study of this spec would be trained again"


@pytest.mark.parametrize("name", sorted(GOLDEN_TRIALS))
def test_trial_keys_are_the_recorded_ones(name):
    metaparameters, trial_key = GOLDEN_TRIALS[name]
    assert TrialSpec(_studies()[name], 3, metaparameters).trial_key == trial_key
    # A study with more trials reuses the trials of a smaller one: the count is not in the trial key.
    more = replace(_studies()[name], trials=_studies()[name].trials + 5)
    assert TrialSpec(more, 3, metaparameters).trial_key == trial_key


def test_a_best_only_study_trains_the_plain_studys_trials_and_probes_as_the_all_trials_study():
    studies = _studies()
    best = studies["digits nesterov 0.9 probes best"]
    plain = StudySpec.build(DIGITS, "nesterov", 0.9, 32)
    assert best.training_spec.study_key == plain.study_key == GOLDEN_STUDIES["digits nesterov 0.9 probes best"][1]
    assert best.probe_spec.study_key == replace(best, probe_trials="all").study_key \
        == "02156e071f7f5daadce585caaaad6245e61c271de389c93fea9b67443d24b999"


def test_sweep_keys_are_the_recorded_ones():
    grid = _grid()
    assert grid.sweep_key == "db7a79a38dabfe99e0adb02ceff30dee19258735bf2d46a02ce92c8adb0b38ca"
    probed = SweepSpec.build(DIGITS, ("nesterov",), (32, 64), (0.5,), probes=("lipschitz",))
    assert probed.sweep_key == "e3c512d7cd1c4182cab991ec0a232028c7678f437f8c57b760ea3c34d7ca10e2"
    fingerprinted = replace(grid, protocol=replace(grid.protocol, data_fingerprint=FINGERPRINT))
    assert fingerprinted.sweep_key == "08e243f8bc0dc161ae977c4750173bc149ce68bfd442c2380808d6c4c70927d8"


def test_adaptive_sweep_keys_are_the_recorded_ones():
    # Re-recorded when the rule became the walk down from the largest batch sizes ("walk-down-1"): the key
    # names the rule, the goal and the width, so an adaptive sweep recorded under the old rule is never
    # replayed as if this rule had chosen its studies (its studies themselves are reused: their keys did not
    # change).
    grid = _grid()
    assert AdaptiveSweepSpec(grid, AdaptiveSettings()).sweep_key \
        == "27ae68364be0abe3c37329f92241eeca7200b1f07d33b5ecf93e03ad3687aca8"
    limited = AdaptiveSweepSpec(grid, AdaptiveSettings(3.0, 16, Budget.parse("2e6steps")))
    assert limited.sweep_key == "7e53024bfda7211fc9394b9ce1811016d5caf2677bd16f7bf85484f9cb365251"
    threshold = AdaptiveSweepSpec(grid, AdaptiveSettings(goal=Goal.THRESHOLD, width=4))
    assert threshold.sweep_key == "c5c52557061027b60693f6b339d2df79594febf054fbff292e3bc3b3e752f098"
    # Every setting that changes which studies the rule picks is in the key.
    keys = {AdaptiveSweepSpec(grid, settings).sweep_key for settings in (
        AdaptiveSettings(), AdaptiveSettings(width=2), AdaptiveSettings(goal=Goal.BOUNDARIES),
        AdaptiveSettings(target=3.0), AdaptiveSettings(max_studies=16))}
    assert len(keys) == 5


def test_key_fields_are_the_recorded_ones():
    """key_fields is also what a study run logs (params ``spec.*``, study.json's ``spec``): same names,
    values, types and order."""
    studies = _studies()
    common = [("workload", DIGITS), ("optimizer", "nesterov"), ("sparsity", 0.9), ("batch_size", 32), ("trials", 32),
              ("goal_error", 0.03), ("max_steps", 5000), ("check_interval", 20), ("seed", 0)]
    probed = list(studies["digits nesterov 0.9 probes best"].key_fields().items())
    assert probed == common + [("probes", ["lipschitz", "noise_scale"]), ("probe_interval", 10),
                               ("probe_trials", "best")]
    assert [type(v) for _, v in probed] == [str, str, float, int, int, float, int, int, int, list, int, str]
    dense = dict(common, optimizer="sgd", sparsity=0.0, batch_size=2)
    assert list(studies["digits sgd fingerprint tf32"].key_fields().items()) == list(dense.items()) + [
        ("allow_tf32", True), ("data_fingerprint", FINGERPRINT)]
    assert list(studies["digits sgd dense"].key_fields().items()) == list(dict(dense, batch_size=64).items())
