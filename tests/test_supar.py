"""SμPar (--parameterization supar, supar.py): each masked convolution's and linear layer's initial variance and
learning rate divided by its density, checked against a hand computation on the digits network; sp's keys
unchanged and the dense supar study sp's own; a bad value refused; a real tiny study under supar."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from analysis.load import load_studies
from edps_mlflow.curves import CurveId
from edps_mlflow.engine import BatchStream, PackedTrainer, SingleTrainer
from edps_mlflow.optimizers import get_optimizer, optimizer_names
from edps_mlflow.parameterization import Parameterization
from edps_mlflow.supar import parameter_groups
from edps_mlflow.sweep_spec import SweepSpec

from conftest import edps_here
from helpers import DIGITS, SMOOTH, digits_data, noise_data, setups_for, study_spec

SCALED = ("conv1.weight", "conv2.weight", "fc.weight")  # the digits network's convolutions and linear layer


def _setups(optimizer: str, sparsity: float, parameterization: str, point: dict[str, float], count: int = 1,
            pruning: str = "random"):
    spec = replace(study_spec(optimizer=optimizer, sparsity=sparsity), pruning=pruning,
                   parameterization=parameterization)
    return setups_for(spec, [dict(point) for _ in range(count)])


def test_initial_variance_of_each_masked_layer_is_the_dense_networks():
    """The same draw as SP's, times density^-1/2 on the kept weights: each layer's mean square over all its
    entries (pruned ones zero) is the dense network's, 1 / fan-in (TF's fan-in variance scaling), within sampling
    error; biases and the learning rate of nothing else change."""
    point = {"learning_rate": 0.1}
    (dense,), (sp,), (supar,) = (_setups("sgd", s, p, point) for s, p in ((0.0, "sp"), (0.7, "sp"), (0.7, "supar")))
    assert set(supar.learning_rate_scales) == set(SCALED) and not sp.learning_rate_scales
    for name in SCALED:
        mask = supar.mask.tensors[name]
        density = float(mask.sum()) / mask.numel()
        assert supar.learning_rate_scales[name] == pytest.approx(1 / density)
        assert torch.allclose(supar.initial_parameters[name], sp.initial_parameters[name] / math.sqrt(density))
        fan_in = mask[0].numel()
        tolerance = 4 * math.sqrt(2 / mask.sum().item())  # the relative error of a mean of squares of kept draws
        for setup in (dense, supar):
            assert setup.initial_parameters[name].pow(2).mean().item() == pytest.approx(1 / fan_in, rel=tolerance)
        assert sp.initial_parameters[name].pow(2).mean().item() == pytest.approx(density / fan_in, rel=tolerance)
    assert torch.equal(supar.initial_parameters["fc.bias"], sp.initial_parameters["fc.bias"])


def _first_updates(setups, images, labels, rate):
    """Each trial's first update per parameter, on the lone path and on the packed path."""
    lone = []
    for setup in setups:
        trainer = SingleTrainer(DIGITS, setup, torch.device("cpu"), channels_last=False)
        trainer.step(images, labels, [rate])
        lone.append({n: p.detach() - setup.initial_parameters[n] for n, p in trainer.model.named_parameters()})
    packed = PackedTrainer(DIGITS, setups, torch.device("cpu"))
    packed.step(images, labels, [rate] * len(setups))
    return lone, [{n: packed.params[n][k] - s.initial_parameters[n] for n in packed.names}
                  for k, s in enumerate(setups)]


def _gradients(setup, images, labels):
    model = DIGITS.build_model()
    model.load_state_dict(setup.initial_parameters)
    DIGITS.loss(model(images), labels).backward()
    return {n: p.grad * setup.mask.tensors[n] for n, p in model.named_parameters()}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_first_update_of_each_layer_is_the_learning_rate_over_its_density(optimizer):
    """By hand: SGD's first update is -(lr / density) g on a masked weight (g its masked gradient), -lr g on a bias;
    Adam's is -(lr / density) g / (|g| + eps), about lr / density in size where g is not tiny, the dense network's
    lr. Two packed trials (SNIP's masks: their densities differ) against each alone: the same numbers."""
    rate = 0.05 if optimizer == "sgd" else 1e-3
    setups = _setups(optimizer, 0.8, "supar", {"learning_rate": rate}, count=2, pruning="snip")
    data = digits_data()
    images, labels = data.train_images[:32], data.train_labels[:32]
    lone, packed = _first_updates(setups, images, labels, rate)
    for setup, alone, together in zip(setups, lone, packed):
        gradients = _gradients(setup, images, labels)
        for name, gradient in gradients.items():
            scale = setup.learning_rate_scales.get(name, 1.0)
            assert (scale > 1.0) == (name in SCALED), name
            expected = -rate * scale * (gradient if optimizer == "sgd" else gradient / (gradient.abs() + 1e-8))
            assert torch.allclose(alone[name], expected, rtol=1e-3, atol=1e-7 * scale), (optimizer, name)
            assert torch.allclose(together[name], alone[name], rtol=1e-4, atol=1e-7 * scale), (optimizer, name)
        if optimizer == "adam":
            kept = gradients["fc.weight"].abs() > 1e-4
            size = alone["fc.weight"][kept].abs()
            assert size.max().item() == pytest.approx(rate * setup.learning_rate_scales["fc.weight"], rel=0.01)
    assert setups[0].learning_rate_scales != setups[1].learning_rate_scales  # each trial its own densities


def test_keys_curves_and_the_dense_supar_study():
    """sp keeps every key (the field at its default is left out); supar at sparsity 0 is the sp study; a sweep over
    both parameterisations has one dense curve and a supar curve per sparsity, charted as .../supar."""
    sp = study_spec(sparsity=0.5)
    assert replace(sp, parameterization="sp").study_key == sp.study_key
    assert replace(sp, parameterization="supar").study_key != sp.study_key
    dense = study_spec()
    assert replace(dense, parameterization="supar").parameterization is Parameterization.SP
    sweep = SweepSpec.build("digits-simple-cnn", ("sgd",), (64, 128), (0.0, 0.5), parameterizations=("sp", "supar"))
    assert sorted({CurveId.of(s).chart_name() for s in sweep.studies()}) == ["sgd/sp0", "sgd/sp0.5", "sgd/sp0.5/supar"]
    assert CurveId.from_tags({"edps.workload": "w", "edps.optimizer": "sgd", "edps.sparsity": "0.5"}) \
        .parameterization == "sp"  # a run from before the field
    assert SweepSpec.build("digits-simple-cnn", ("sgd",), (64,), (0.5,)).sweep_key == \
        SweepSpec.build("digits-simple-cnn", ("sgd",), (64,), (0.5,), parameterizations=("sp",)).sweep_key


@pytest.mark.parametrize("args", [["study", "--parameterization", "mup"],
                                  ["sweep", "--parameterizations", "sp,mup"],
                                  ["sweep", "--parameterizations", "supar,supar"]])
def test_a_bad_parameterization_is_refused_in_one_line(args, sqlite_uri):
    code, printed = edps_here(args, sqlite_uri)
    assert code == 2 and len(printed.strip().splitlines()) == 1, printed
    assert "parameterization" in printed


def test_a_tiny_supar_study_on_digits(sqlite_uri):
    """A real study under supar: its run carries the curve's tag, and the analysis' study table its column."""
    code, printed = edps_here(["study", "--bs", "64", "--sparsity", "0.5", "--pruning", "random", "--parameterization",
                               "supar", "--trials", "2", "--max-steps", "40", "--check-interval", "20",
                               "--workers", "1"], sqlite_uri)
    assert code == 0, printed
    table = load_studies((), sqlite_uri)
    assert list(table["parameterization"]) == ["supar"]
    assert CurveId.from_values(table.iloc[0]).chart_name() == "sgd/sp0.5/random/supar"


@pytest.mark.parametrize("name", optimizer_names())
def test_a_packed_supar_trial_equals_its_lone_torch_trial_to_the_bit(name):
    """test_optimizers' proof under supar: two SNIP trials (their own densities, so their own multipliers) packed
    and each alone with its torch optimizer over SμPar's parameter groups, fed the same gradients, the first
    stopping after 3 steps, the other warmed up: its weights after 6 steps are the same to the bit."""
    data = noise_data()
    points = get_optimizer(name).space.points(2)
    points[1].update(warmup_steps=3.0)
    spec = replace(study_spec(optimizer=name, sparsity=0.5, batch_size=16), parameterization="supar")
    setups = setups_for(spec, points, workload=SMOOTH, data=data)
    packed = PackedTrainer(SMOOTH, setups, torch.device("cpu"))
    lone = [{n: p.clone() for n, p in setup.initial_parameters.items()} for setup in setups]
    optimizers = [s.optimizer.kind.torch_optimizer(parameter_groups(list(p), list(p.values()), s.learning_rate_scales,
                                                                    s.optimizer.schedule.learning_rate), s.optimizer)
                  for s, p in zip(setups, lone)]
    stream = BatchStream(data.train_size, 16, 0, torch.device("cpu"))
    for step in range(6):
        if step == 3:
            packed.keep([1])
            setups, lone, optimizers = setups[1:], lone[1:], optimizers[1:]
        batch = stream.next()
        images, labels = data.train_images[batch], data.train_labels[batch]
        gradients, _ = packed._gradients(packed.params, images, labels)
        rates = [setup.optimizer.schedule.learning_rate_at(step) for setup in setups]
        for k, (setup, parameters, optimizer) in enumerate(zip(setups, lone, optimizers)):
            for group in optimizer.param_groups:
                group["lr"] = rates[k] * group.get("lr_scale", 1.0)  # as SingleTrainer.step
            for n, parameter in parameters.items():
                parameter.grad = gradients[n][k] * setup.mask.tensors[n]
            optimizer.step()
        packed.step(images, labels, rates)
    assert setups[0].learning_rate_scales
    for n, parameter in lone[0].items():
        assert torch.equal(packed.params[n][0], parameter), (name, n)


def test_a_csv_study_table_reads_its_parameterization(tmp_path):
    """The study table's CSV column: an empty cell (or none at all) is sp, as every study before the field; an
    unknown value is refused naming its row."""
    from analysis.csv_io import read_csv
    from analysis.regimes import curves
    from edps_mlflow.errors import EdpsError

    path = tmp_path / "studies.csv"
    path.write_text("workload,optimizer,sparsity,batch_size,parameterization,steps_to_result\n"
                    "w,sgd,0.5,64,supar,100\nw,sgd,0.5,64,,120\nw,sgd,0.5,128,SP,60\n")
    table = read_csv(path)
    assert list(table["parameterization"]) == ["supar", None, "sp"]
    assert sorted(key[-1] for key in curves(table)) == ["sp", "supar"]
    path.write_text("workload,optimizer,sparsity,batch_size,parameterization,steps_to_result\nw,sgd,0.5,64,mup,100\n")
    with pytest.raises(EdpsError, match="column parameterization, row 2: unknown parameterization 'mup'"):
        read_csv(path)


def _function_change(optimizer: str, sparsity: float, parameterization: str, rate: float) -> float:
    """The first update's change of the logits on 256 digits, relative to their size, averaged over 3 seeds."""
    data = digits_data()
    images, labels = data.train_images[:256], data.train_labels[:256]
    changes = []
    for seed in range(3):
        spec = replace(study_spec(optimizer=optimizer, sparsity=sparsity, seed=seed), pruning="random",
                       parameterization=parameterization)
        (setup,) = setups_for(spec, [{"learning_rate": rate}])
        trainer = SingleTrainer(DIGITS, setup, torch.device("cpu"), channels_last=False)
        with torch.no_grad():
            before = trainer.model(images)
        trainer.step(images, labels, [rate])
        with torch.no_grad():
            changes.append(((trainer.model(images) - before).norm() / before.norm()).item())
    return sum(changes) / len(changes)


@pytest.mark.parametrize("optimizer, rate", [("sgd", 0.05), ("adam", 1e-3)])
def test_the_first_update_moves_the_network_as_much_as_the_dense_one_under_supar(optimizer, rate):
    """SμPar's promise at a random mask of sparsity 0.9, at the dense network's learning rate: the first update
    changes the logits about as much as in the dense network (measured 1.18x for SGD, 0.78x for Adam), where SP's
    change far less (0.06x, 0.42x)."""
    dense = _function_change(optimizer, 0.0, "sp", rate)
    supar, sp = (_function_change(optimizer, 0.9, form, rate) / dense for form in ("supar", "sp"))
    assert 0.5 < supar < 2.0 and supar > 1.5 * sp, (supar, sp)


def test_a_network_supar_defines_no_rule_for_is_refused_in_one_line():
    """A weight of two dimensions or more outside convolutions, linear layers and embeddings has no known fan-in:
    refused before any data is loaded (study._checked_inputs), every built-in network passes."""
    from edps_mlflow.errors import EdpsError
    from edps_mlflow.supar import check_network
    from edps_mlflow.workloads import WORKLOADS, get_workload

    class Bilinear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mix = torch.nn.Bilinear(4, 4, 2)

    with pytest.raises(EdpsError, match="no rule for the Bilinear weight mix.weight"):
        check_network(Bilinear())
    for name in WORKLOADS:
        check_network(get_workload(name).build_model())
