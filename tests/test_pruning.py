import numpy as np
import pytest
import torch

from edps_mlflow.engine import BatchStream, PackedTrainer, SingleTrainer
from edps_mlflow.models import SimpleCNN, init_fan_in_truncated_normal
from edps_mlflow.pruning.mask import Mask
from edps_mlflow.pruning.snip import snip_mask

from helpers import DIGITS, digits_data, setups_for, study_spec


def _mnist_shaped_model(seed: int) -> SimpleCNN:
    model = SimpleCNN()
    init_fan_in_truncated_normal(model, torch.Generator().manual_seed(seed))
    return model


@pytest.mark.parametrize("sparsity", [0.5, 0.7, 0.9])
def test_snip_keeps_exactly_k_and_prunes_every_bias(sparsity):
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(300, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (300,), generator=generator)
    model = _mnist_shaped_model(0)
    mask = snip_mask(model, images, labels, sparsity, DIGITS.loss)
    assert mask.total == 62_346
    assert mask.kept == round(62_346 * (1 - sparsity))
    for name, tensor in mask.tensors.items():
        assert set(torch.unique(tensor).tolist()) <= {0.0, 1.0}
        if name.endswith("bias"):
            assert tensor.sum().item() == 0, f"{name} kept a bias"
    summary = mask.summary()
    assert summary["kept"] == mask.kept
    assert summary["layers"]["fc.bias"]["kept_fraction"] == 0.0


def test_dense_mask_at_zero_sparsity():
    data = digits_data()
    model = DIGITS.build_model()
    mask = snip_mask(model, data.train_images, data.train_labels, 0.0, DIGITS.loss)
    assert mask.is_dense and mask.kept == 6090


def test_snip_ranks_by_weight_times_summed_gradient():
    data = digits_data()
    model = DIGITS.build_model()
    init_fan_in_truncated_normal(model, torch.Generator().manual_seed(3))
    mask = snip_mask(model, data.train_images, data.train_labels, 0.9, DIGITS.loss)
    # Independent computation: dL/dc summed over batches of 100 with an explicit multiplicative mask.
    from torch.func import functional_call
    from torch.nn import functional as F

    params = {n: p.detach() for n, p in model.named_parameters()}
    ones = {n: torch.ones_like(p, requires_grad=True) for n, p in params.items()}
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    for start in range(0, data.train_size, 100):
        out = functional_call(model, {n: params[n] * ones[n] for n in params},
                              (data.train_images[start:start + 100],))
        grads = torch.autograd.grad(F.cross_entropy(out, data.train_labels[start:start + 100]), list(ones.values()))
        for n, g in zip(ones, grads):
            total[n] += g
    scores = torch.cat([total[n].abs().flatten() for n in params])
    keep = round(scores.numel() * 0.1)
    expected = torch.zeros_like(scores)
    expected[torch.topk(scores, keep).indices] = 1
    got = torch.cat([mask.tensors[n].flatten() for n in params])
    # Ties at the threshold aside, the same parameters are kept.
    assert (got != expected).sum().item() <= 2


def test_mask_file_loads_without_pickle(tmp_path):
    data = digits_data()
    model = DIGITS.build_model()
    init_fan_in_truncated_normal(model, torch.Generator().manual_seed(0))
    mask = snip_mask(model, data.train_images, data.train_labels, 0.5, DIGITS.loss)
    mask_path, summary_path = mask.save(tmp_path, "mask.npz", "summary.json")
    with np.load(mask_path, allow_pickle=False) as arrays:
        assert set(arrays.files) == set(mask.tensors)
        assert all(arrays[n].dtype == bool for n in arrays.files)
    loaded = Mask.load(mask_path)
    assert all(torch.equal(loaded.tensors[n], mask.tensors[n]) for n in mask.tensors)
    assert '"kept"' in summary_path.read_text()


@pytest.mark.parametrize("optimizer", ["momentum", "nesterov"])
def test_pruned_weights_and_momentum_stay_zero_at_every_step(optimizer):
    """Checked after each of 10 steps: a pruned weight or momentum entry that became non-zero at any step
    (the first step fills the buffers) fails here; 100 steps would prove nothing more at 10x the cost."""
    data = digits_data()
    spec = study_spec(optimizer=optimizer, sparsity=0.9, batch_size=32)
    points = [{"learning_rate": 0.05, "momentum": 0.95}, {"learning_rate": 0.02, "momentum": 0.99}]
    setups = setups_for(spec, points)
    single = SingleTrainer(DIGITS, setups[0], torch.device("cpu"), channels_last=True)
    packed = PackedTrainer(DIGITS, setups, torch.device("cpu"))
    stream = BatchStream(data.train_size, 32, 0, torch.device("cpu"))
    pruned = {n: m == 0 for n, m in setups[0].mask.tensors.items()}
    assert sum(int(p.sum()) for p in pruned.values()) == 6090 - round(6090 * 0.1)
    for step in range(10):
        batch = stream.next()
        single.step(data.train_images[batch], data.train_labels[batch], None)
        packed.step(data.train_images[batch], data.train_labels[batch], None)
        for name, parameter in single.model.named_parameters():
            assert torch.all(parameter.detach()[pruned[name]] == 0), (step, name)
            buffer = single.optimizer.state[parameter]["momentum_buffer"]
            assert torch.all(buffer[pruned[name]] == 0), (step, name)
        for position, setup in enumerate(setups):
            for name, mask in setup.mask.tensors.items():
                assert torch.all(packed.params[name][position][mask == 0] == 0), (step, position, name)
                (group,) = packed.groups  # SP: every parameter in one group
                assert torch.all(group.state.buffers[name][0][position][mask == 0] == 0), (step, position, name)
    for name, parameter in single.model.named_parameters():
        # Kept weights did move.
        assert not torch.equal(parameter.detach()[~pruned[name]], setups[0].initial_parameters[name][~pruned[name]]) \
            or (~pruned[name]).sum() == 0
