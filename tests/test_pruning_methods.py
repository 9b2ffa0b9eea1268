"""Every pruning method (edps_mlflow/pruning/) against an independent, plain computation of its definition, entry
for entry, on a small network; exact kept counts; masks that stay exact through training; each method's masks
pinned (a change of a method's definition is a change of results); the method as a study field that leaves
SNIP's keys alone."""

from __future__ import annotations

import copy
import zlib

import numpy as np
import pytest
import torch
from dataclasses import replace
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from edps_mlflow.config import StudySpec, TrialSpec
from edps_mlflow.data.splits import DataSplits
from edps_mlflow.engine import BatchStream, PackedTrainer, SingleTrainer
from edps_mlflow.errors import EdpsError
from edps_mlflow.models import init_fan_in_truncated_normal
from edps_mlflow.pruning import METHODS, Prunes, method_info, method_names, parse_method, parse_methods
from edps_mlflow.pruning.base import ScoreContext
from edps_mlflow.pruning.prune import prune_at_initialisation
from edps_mlflow.pruning.random_erk import erk_densities
from edps_mlflow.pruning.snip import snip_mask
from edps_mlflow.sweep import SweepSpec

from helpers import DIGITS, digits_data, setups_for, study_spec


class TinyNet(nn.Module):
    """conv 3x3 1->4, ReLU, max-pool, linear 36->10: 410 parameters, 396 of them weights."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 3 * 3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(x.reshape(x.shape[0], -1))


TINY = replace(DIGITS, name="tiny-test", build_model=TinyNet)
WEIGHTS = ("conv.weight", "fc.weight")


def _data() -> DataSplits:
    data = digits_data()
    return DataSplits(data.train_images[:300], data.train_labels[:300], data.validation_images[:50],
                      data.validation_labels[:50])


def _model(seed: int) -> nn.Module:
    model = TinyNet()
    init_fan_in_truncated_normal(model, torch.Generator().manual_seed(seed))
    return model


def _mask(method: str, seed: int, sparsity: float, data: DataSplits | None = None) -> dict[str, torch.Tensor]:
    context = ScoreContext(_model(seed), data or _data(), TINY, seed, sparsity)
    mask, _ = prune_at_initialisation(method, context)
    return mask.tensors


def _stream_seed(init_seed: int, stream: str) -> int:
    # The documented derivation (pruning/base.py), written out again.
    return int(np.random.SeedSequence([init_seed, zlib.crc32(stream.encode())]).generate_state(1)[0])


def _top(scores: dict[str, np.ndarray], keep: int, lowest: bool = False, margin: float = 1e-4) -> dict[str, np.ndarray]:
    """The plain cut: a stable sort of the concatenated scores, the first ``keep``; the gap at the cut is checked
    to be far above rounding (``margin``, relative: float32 against these float64 scores; SynFlow is float64 in
    both, and its exact ties are settled by position on both sides), so that the method must find the same set."""
    names = list(scores)
    flat = np.concatenate([scores[n].ravel() for n in names])
    order = np.argsort(flat if lowest else -flat, kind="stable")
    if 0 < keep < flat.size:
        inside, outside = abs(flat[order[keep - 1]]), abs(flat[order[keep]])
        gap = abs(inside - outside)
        # An exact tie is settled by position, here (a stable sort) as in the methods cut after SNIP; a gap within
        # rounding could fall either way.
        assert gap > margin * max(inside, outside, 1e-30) or (gap == 0 and margin < 1e-6), "a near-tie at the cut"
    chosen = np.zeros(flat.size)
    chosen[order[:keep]] = 1.0
    out, offset = {}, 0
    for name in names:
        out[name] = chosen[offset:offset + scores[name].size].reshape(scores[name].shape)
        offset += scores[name].size
    return out


def _assert_equal(mask: dict[str, torch.Tensor], expected: dict[str, np.ndarray], kept_whole: tuple[str, ...] = ()):
    for name, tensor in mask.items():
        if name in expected:
            assert np.array_equal(tensor.numpy(), expected[name]), name
        else:
            assert name in kept_whole and torch.all(tensor == 1), name


# ---- exact counts --------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", method_names())
@pytest.mark.parametrize("sparsity", [0.5, 0.9])
def test_each_method_keeps_exactly_its_count(method, sparsity):
    mask = _mask(method, 3, sparsity)
    info = method_info(method)
    for name, tensor in mask.items():
        assert set(torch.unique(tensor).tolist()) <= {0.0, 1.0}
        if info.prunes is Prunes.WEIGHTS and name not in WEIGHTS:
            assert torch.all(tensor == 1), f"{method} pruned {name}, which it keeps"
    prunable = [n for n in mask if info.prunes is Prunes.WEIGHTS_AND_BIASES or n in WEIGHTS]
    total = sum(mask[n].numel() for n in prunable)
    kept = {n: int(mask[n].sum()) for n in prunable}
    if method in ("random", "shuffle(random)"):
        assert kept == {n: round(mask[n].numel() * (1 - sparsity)) for n in prunable}
    elif method.endswith("random-erk") or method.endswith("random-erk)"):
        densities = erk_densities({n: mask[n].shape for n in prunable}, 1 - sparsity)
        assert kept == {n: round(mask[n].numel() * densities[n]) for n in prunable}
    else:
        assert sum(kept.values()) == round(total * (1 - sparsity))
    if method.startswith("shuffle("):  # the base method's count in every tensor
        base = _mask(method[len("shuffle("):-1], 3, sparsity)
        assert kept == {n: int(base[n].sum()) for n in prunable}


def test_nothing_is_pruned_or_scored_at_sparsity_zero():
    for method in METHODS:
        context = ScoreContext(_model(1), _data(), TINY, 1, 0.0)
        mask, record = prune_at_initialisation(method, context)
        assert mask.is_dense and record.source.value == "none"


# ---- each method against a plain computation -------------------------------------------------------------
def test_snip_is_the_plain_sum_of_gradients_of_a_multiplicative_mask():
    data, seed, sparsity = _data(), 5, 0.8
    model = copy.deepcopy(_model(seed)).double()
    params = {n: p.detach() for n, p in model.named_parameters()}
    ones = {n: torch.ones_like(p, requires_grad=True) for n, p in params.items()}
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    for start in range(0, 300, 100):
        out = functional_call(model, {n: params[n] * ones[n] for n in params}, (data.train_images[start:start + 100].double(),))
        for n, g in zip(ones, torch.autograd.grad(F.cross_entropy(out, data.train_labels[start:start + 100]), list(ones.values()))):
            total[n] += g
    scores = {n: total[n].abs().numpy() for n in params}
    expected = _top(scores, round(410 * (1 - sparsity)))
    _assert_equal(_mask("snip", seed, sparsity, data), expected)
    # The strategy is the paper's SNIP as it was before methods existed, bit for bit.
    old = snip_mask(_model(seed), data.train_images, data.train_labels, sparsity, TINY.loss)
    assert all(torch.equal(old.tensors[n], t) for n, t in _mask("snip", seed, sparsity, data).items())


def test_magnitude_keeps_the_largest_initial_weights():
    seed, sparsity = 2, 0.7
    model = _model(seed)
    scores = {n: p.detach().abs().double().numpy() for n, p in model.named_parameters() if n in WEIGHTS}
    _assert_equal(_mask("magnitude", seed, sparsity), _top(scores, round(396 * (1 - sparsity))), ("conv.bias", "fc.bias"))


def test_random_keeps_a_uniform_subset_of_each_tensor_from_the_trials_own_stream():
    seed, sparsity = 4, 0.75
    generator = torch.Generator().manual_seed(_stream_seed(seed, "edps.pruning.random"))
    draws = {n: torch.rand(shape, generator=generator).numpy() for n, shape in (("conv.weight", (4, 1, 3, 3)),
                                                                                  ("fc.weight", (10, 36)))}
    expected = {n: _top({n: d}, round(d.size * (1 - sparsity)))[n] for n, d in draws.items()}
    _assert_equal(_mask("random", seed, sparsity), expected, ("conv.bias", "fc.bias"))
    # Another trial draws another mask; the weights' own stream does not decide it.
    assert not torch.equal(_mask("random", seed + 1, sparsity)["fc.weight"], _mask("random", seed, sparsity)["fc.weight"])
    # Uniform: over many trials every entry is kept about (1 - sparsity) of the time.
    frequency = sum(_mask("random", s, 0.5)["fc.weight"] for s in range(200)) / 200
    assert float(frequency.min()) > 0.3 and float(frequency.max()) < 0.7


def test_random_erk_densities_follow_rigl():
    shapes = {"conv": torch.Size((4, 1, 3, 3)), "fc": torch.Size((10, 64))}
    # By hand: raw densities (4+1+3+3)/36 and (10+64)/640, scaled to keep 10% of the 676 entries.
    raw = {"conv": 11 / 36, "fc": 74 / 640}
    scale = 0.1 * 676 / (raw["conv"] * 36 + raw["fc"] * 640)
    assert erk_densities(shapes, 0.1) == pytest.approx({n: scale * r for n, r in raw.items()})
    # At density 0.5 the conv would exceed 1: it is kept whole and the rest of the budget goes to fc.
    densities = erk_densities(shapes, 0.5)
    assert densities["conv"] == 1.0 and densities["fc"] == pytest.approx((0.5 * 676 - 36) / 640)
    mask = _mask("random-erk", 1, 0.9)
    small = erk_densities({n: mask[n].shape for n in WEIGHTS}, 0.1)
    assert {n: int(mask[n].sum()) for n in WEIGHTS} == {n: round(mask[n].numel() * small[n]) for n in WEIGHTS}


def _plain_grasp_sample(data: DataSplits, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(_stream_seed(seed, "edps.pruning.grasp.sample"))
    order = torch.randperm(300, generator=generator).tolist()
    picks = {label: [i for i in order if int(data.train_labels[i]) == label][:10] for label in range(10)}
    index = [i for label in range(10) for i in picks[label]]
    return data.train_images[index].double(), data.train_labels[index]


def test_grasp_is_minus_theta_times_the_hessian_gradient_product_on_a_class_balanced_sample():
    data, seed, sparsity = _data(), 6, 0.8
    model = copy.deepcopy(_model(seed)).double()
    others = {n: p.detach() for n, p in model.named_parameters() if n not in WEIGHTS}
    weights = tuple(dict(model.named_parameters())[n].detach() for n in WEIGHTS)
    images, labels = _plain_grasp_sample(data, seed)
    halves = [(images[:50], labels[:50]), (images[50:], labels[50:])]

    def loss(half, *w):
        out = functional_call(model, {**others, **dict(zip(WEIGHTS, w))}, (half[0],))
        return F.cross_entropy(out / 200.0, half[1])

    gradient = [sum(g) for g in zip(*(torch.autograd.functional.jacobian(lambda *w: loss(h, *w), weights) for h in halves))]
    product = [sum(v) for v in zip(*(torch.autograd.functional.hvp(lambda *w: loss(h, *w), weights, tuple(gradient))[1]
                                     for h in halves))]
    scores = {n: (-w * hg).numpy() for n, w, hg in zip(WEIGHTS, weights, product)}
    norm = abs(sum(s.sum() for s in scores.values())) + 1e-10
    expected = _top({n: s / norm for n, s in scores.items()}, round(396 * (1 - sparsity)), lowest=True)
    _assert_equal(_mask("grasp", seed, sparsity, data), expected, ("conv.bias", "fc.bias"))


def test_synflow_prunes_iteratively_by_synaptic_flow_on_the_exponential_schedule():
    seed, sparsity = 8, 0.8
    model = _model(seed)
    magnitude = {n: p.detach().double().abs() for n, p in model.named_parameters()}
    masks = {n: torch.ones_like(magnitude[n]) for n in WEIGHTS}
    ones = torch.ones(1, 1, 8, 8, dtype=torch.float64)
    for r in range(1, 101):
        w = {n: (magnitude[n] * masks[n]).requires_grad_() for n in WEIGHTS}
        hidden = F.max_pool2d(F.relu(F.conv2d(ones, w["conv.weight"], magnitude["conv.bias"])), 2)
        flow = F.linear(hidden.reshape(1, -1), w["fc.weight"], magnitude["fc.bias"]).sum()
        grads = torch.autograd.grad(flow, [w[n] for n in WEIGHTS])
        scores = {n: np.where(masks[n].numpy() > 0, (g * w[n]).detach().abs().numpy(), -1.0) for n, g in zip(WEIGHTS, grads)}
        keep = round(396 * (1 - sparsity) ** (r / 100))
        masks = {n: torch.from_numpy(m) for n, m in _top(scores, keep, margin=1e-9).items()}
    _assert_equal(_mask("synflow", seed, sparsity), {n: m.numpy() for n, m in masks.items()}, ("conv.bias", "fc.bias"))


def test_a_shuffle_keeps_each_tensors_count_at_uniform_positions():
    seed, sparsity = 9, 0.7
    base = _mask("magnitude", seed, sparsity)
    generator = torch.Generator().manual_seed(_stream_seed(seed, "edps.pruning.shuffle"))
    draws = {n: torch.rand(base[n].shape, generator=generator).numpy() for n in WEIGHTS}
    expected = {n: _top({n: draws[n]}, int(base[n].sum()))[n] for n in WEIGHTS}
    _assert_equal(_mask("shuffle(magnitude)", seed, sparsity), expected, ("conv.bias", "fc.bias"))
    # Independent of where the method put its weights: the overlap with the method's own mask is a random
    # subset's (count^2 / n on average), not the method's (count).
    overlaps, chance, own = [], [], []
    for s in range(40):
        original, shuffled = _mask("magnitude", s, sparsity)["fc.weight"], _mask("shuffle(magnitude)", s, sparsity)["fc.weight"]
        count = float(original.sum())
        overlaps.append(float((original * shuffled).sum()))
        chance.append(count * count / original.numel())
        own.append(count)
    assert abs(np.mean(overlaps) - np.mean(chance)) < 0.15 * np.mean(chance) and np.mean(overlaps) < 0.5 * np.mean(own)


# ---- masks pinned ---------------------------------------------------------------------------------------
# Each method's kept count per tensor (conv1, conv2, fc weights; biases kept unless SNIP) for trial 1 of a digits
# study at sparsity 0.9: a change here is a change of the method's definition, hence of results (bump
# RESULTS_VERSION). Counts, not positions: like test_results_version, this must not fail on kernels that differ
# in the last bits of a float (a position at the threshold could flip; a tensor's count hardly moves).
RECORDED_COUNTS = {
    "snip": [73, 0, 269, 0, 267, 0], "random": [14, 16, 461, 32, 128, 10], "random-erk": [65, 16, 152, 32, 387, 10],
    "magnitude": [98, 16, 339, 32, 166, 10], "grasp": [97, 16, 168, 32, 338, 10], "synflow": [101, 16, 289, 32, 213, 10],
}


def test_method_masks_are_the_recorded_ones():
    data = digits_data()
    found = {}
    for method in METHODS:
        spec = StudySpec.build("digits-simple-cnn", "sgd", 0.9, 64, pruning=method)
        trial = TrialSpec(spec, 1, {"learning_rate": 0.1})
        model = DIGITS.build_model()
        init_fan_in_truncated_normal(model, torch.Generator().manual_seed(trial.init_seed))
        mask, _ = prune_at_initialisation(method, ScoreContext(model, data, DIGITS, trial.init_seed, 0.9))
        found[method] = [int(tensor.sum()) for tensor in mask.tensors.values()]
    assert found == RECORDED_COUNTS, found


# ---- masks stay exact through training -------------------------------------------------------------------
@pytest.mark.parametrize("method", ["random-erk", "shuffle(grasp)"])
def test_pruned_weights_and_momentum_stay_zero_for_a_weights_only_method(method):
    data = digits_data()
    spec = replace(study_spec(optimizer="nesterov", sparsity=0.9, batch_size=32), pruning=method)
    setups = setups_for(spec, [{"learning_rate": 0.05, "momentum": 0.95}, {"learning_rate": 0.02, "momentum": 0.99}])
    single = SingleTrainer(DIGITS, setups[0], torch.device("cpu"), channels_last=True)
    packed = PackedTrainer(DIGITS, setups, torch.device("cpu"))
    stream = BatchStream(data.train_size, 32, 0, torch.device("cpu"))
    for step in range(5):
        batch = stream.next()
        single.step(data.train_images[batch], data.train_labels[batch], None)
        packed.step(data.train_images[batch], data.train_labels[batch], None)
        for name, parameter in single.model.named_parameters():
            pruned = setups[0].mask.tensors[name] == 0
            assert torch.all(parameter.detach()[pruned] == 0), (step, name)
            assert torch.all(single.optimizer.state[parameter]["momentum_buffer"][pruned] == 0), (step, name)
        for position, setup in enumerate(setups):
            for name, mask in setup.mask.tensors.items():
                assert torch.all(packed.params[name][position][mask == 0] == 0), (step, position, name)
                (group,) = packed.groups  # SP: every parameter in one group
                assert torch.all(group.state.buffers[name][0][position][mask == 0] == 0), (step, position, name)
    # The biases were kept, and trained.
    assert not torch.equal(single.model.fc.bias.detach(), setups[0].initial_parameters["fc.bias"])


# ---- the method as a study field -------------------------------------------------------------------------
def test_the_method_is_in_the_key_except_snips_and_the_dense_study_is_one():
    snip = StudySpec.build("digits-simple-cnn", "momentum", 0.9, 128)
    assert snip.pruning == "snip" and "pruning" not in snip.key_fields()
    assert replace(snip, pruning="snip").study_key == snip.study_key
    keys = {StudySpec.build("digits-simple-cnn", "momentum", 0.9, 128, pruning=m).study_key for m in method_names()}
    assert len(keys) == len(method_names())
    grasp = StudySpec.build("digits-simple-cnn", "momentum", 0.9, 128, pruning="grasp")
    assert grasp.key_fields()["pruning"] == "grasp" and list(grasp.key_fields())[-1] == "pruning"
    # Recorded: a key that changes makes every stored study of the spec invisible.
    assert grasp.study_key == GOLDEN_GRASP
    assert StudySpec.build("digits-simple-cnn", "sgd", 0.0, 64, pruning="synflow") == \
        StudySpec.build("digits-simple-cnn", "sgd", 0.0, 64)


GOLDEN_GRASP = "6340e56bca338d730bdef60982e4c026a279fd151f2791aa70ff218520247722"


def test_method_names_are_checked_before_any_work():
    assert parse_method(" Shuffle( SNIP ) ") == "shuffle(snip)"
    assert parse_methods("snip, random,shuffle(random-erk)") == ("snip", "random", "shuffle(random-erk)")
    for bad, message in (("snp", "unknown pruning method 'snp'"), ("shuffle(shuffle(snip))", "unknown pruning"),
                         ("", "name at least one")):
        with pytest.raises(EdpsError, match=message):
            parse_methods(bad) if bad == "" else parse_method(bad)
    with pytest.raises(EdpsError, match="repeat a value: snip"):
        parse_methods("snip,random,SNIP")


def test_a_sweep_spans_methods_with_one_dense_study():
    grid = SweepSpec.build("digits-simple-cnn", ("sgd",), (16, 64), (0.0, 0.9), prunings=("snip", "random", "shuffle(snip)"))
    studies = grid.studies()
    assert len(studies) == 2 + 3 * 2 and len({s.study_key for s in studies}) == len(studies)
    assert [s.pruning for s in studies if s.sparsity == 0] == ["snip", "snip"]
    snip_only = SweepSpec.build("digits-simple-cnn", ("sgd",), (16, 64), (0.0, 0.9))
    assert snip_only.sweep_key == replace(snip_only, prunings=("snip",)).sweep_key != grid.sweep_key
    assert grid.params()["pruning"] == "snip,random,shuffle(snip)"


# ---- the comparison of methods (analysis, no training) -----------------------------------------------------
def test_compare_pruning_relates_each_method_to_dense_and_to_its_shuffle(tmp_path):
    import pandas as pd

    from analysis.csv_io import read_csv
    from analysis.pruning_methods import intervals_footnote, pruning_comparison, pruning_summary, summary_for_people
    from analysis.regimes import fit_table, with_curve_axes

    sizes = (16, 64, 256, 1024)
    dense = {b: 1000.0 * (1 + 64 / b) for b in sizes}
    curves = {("snip", 0.0): dense, ("snip", 0.9): {b: 2 * s for b, s in dense.items()},
              ("shuffle(snip)", 0.9): {b: 2.2 * s for b, s in dense.items()},
              ("magnitude", 0.9): {b: s * (1 + 2 * (b >= 256)) for b, s in dense.items()}}
    rows = [{"workload": "digits-simple-cnn", "optimizer": "sgd", "sparsity": s, "pruning": m, "batch_size": b,
             "steps_to_result": v} for (m, s), steps in curves.items() for b, v in steps.items()]
    path = tmp_path / "studies.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    table = read_csv(path)
    comparison = pruning_comparison(table)
    snip = comparison[comparison["pruning"] == "snip"]
    assert list(snip["relative_to_dense"]) == pytest.approx([2.0] * 4)
    summary = pruning_summary(table, fit_table(table, None, repeats=0)).set_index("pruning")
    assert summary.loc["snip", "same_shape"] and summary.loc["shuffle(snip)", "same_shape"]
    assert not summary.loc["magnitude", "same_shape"] and summary.loc["magnitude", "shape"].startswith("differs: x3")
    assert summary.loc["snip", "relative_to_shuffle"] == pytest.approx(1 / 1.1)
    assert summary.loc["snip", "b_crit"] == pytest.approx(summary.loc["snip", "dense_b_crit"], rel=1e-3)
    assert list(summary_for_people(summary.reset_index())["method"]) == ["magnitude", "shuffle(snip)", "snip"]
    # Intervals resting on one reaching trial a study (exact early stopping) have no width: two of them that do
    # not overlap say nothing, so no overlap is judged, and the footnote says why (seen on the digits sweep).
    fits = fit_table(table, None, repeats=0).assign(b_crit_low=lambda f: f["b_crit"], b_crit_high=lambda f: f["b_crit"])
    judged = pruning_summary(table, fits).set_index("pruning")
    assert judged.loc["magnitude", "b_crit_overlaps_dense"] == False  # noqa: E712 (a numpy bool)
    assert intervals_footnote(judged) is None
    narrow = fits.assign(interval_studies=4, interval_studies_one_reaching=3, interval_trials_superseded=90)
    unjudged = pruning_summary(table, narrow)
    assert unjudged["b_crit_overlaps_dense"].isna().all()
    assert "one reaching trial" in unjudged.set_index("pruning").loc["magnitude", "note"]
    assert set(summary_for_people(unjudged)["B_crit overlaps dense"]) == {"not judged*"}
    assert intervals_footnote(unjudged).startswith("* not judged: the B_crit intervals of 3 curve(s)")
    # A B_crit the hyperbola does not give reads n/a, as in the fit table, and is compared with nothing; the
    # others in three significant figures (an interval end of 1.5e-21 once printed as such).
    outside = fits.assign(note=lambda f: f["pruning"].map({"magnitude": "B_crit 1e+05 lies far outside the measured "
                                                                        "batch sizes 16..1024: ..."}).fillna(""),
                          b_crit_low=lambda f: f["b_crit"].where(f["pruning"] != "snip", 1.5e-21))
    people = summary_for_people(pruning_summary(table, outside)).set_index("method")
    assert people.loc["magnitude", "B_crit"] == "n/a" and people.loc["magnitude", "B_crit overlaps dense"] == "-"
    assert "e-21" not in people.loc["snip", "B_crit"] and people.loc["snip", "B_crit"].endswith(" [0, 64]")
    # A CSV written before methods existed is SNIP's; a name that is no method is refused with its row.
    legacy = tmp_path / "legacy.csv"
    pd.DataFrame(rows).drop(columns="pruning").to_csv(legacy, index=False)
    assert read_csv(legacy)["pruning"].isna().all() and set(with_curve_axes(read_csv(legacy))["pruning"]) == {"snip"}
    bad = tmp_path / "bad.csv"
    pd.DataFrame(rows).assign(pruning="prune-it").to_csv(bad, index=False)
    with pytest.raises(EdpsError, match="column pruning, row 2: unknown pruning method 'prune-it'"):
        read_csv(bad)


def test_the_pruning_figure_draws_sp_and_supar_of_one_method_as_two_lines():
    """Seen on the SμPar digits store: one line per method zig-zagged between its sp and supar points."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from analysis.plots import draw_pruning
    from analysis.pruning_methods import pruning_comparison

    sizes = (8, 32, 128)
    rows = [{"workload": "digits-simple-cnn", "optimizer": "sgd", "sparsity": s, "pruning": "snip",
             "parameterization": p, "batch_size": b, "steps_to_result": 100.0 * factor * (1 + 16 / b)}
            for s, p, factor in ((0.0, "sp", 1), (0.9, "sp", 8), (0.9, "supar", 16)) for b in sizes]
    figure = draw_pruning(pruning_comparison(pd.DataFrame(rows)), "digits-simple-cnn", "sgd", 0.9)
    steps_axis = figure.axes[0]
    lines = {line.get_label(): line for line in steps_axis.get_lines()}
    assert set(lines) == {"dense", "snip", "snip supar"}
    assert list(lines["snip"].get_ydata()) == pytest.approx([800 * (1 + 16 / b) for b in sizes])
    assert list(lines["snip supar"].get_ydata()) == pytest.approx([1600 * (1 + 16 / b) for b in sizes])
    assert lines["snip supar"].get_linestyle() == ":" and "dotted: supar" in figure._suptitle.get_text()
    plt.close(figure)
