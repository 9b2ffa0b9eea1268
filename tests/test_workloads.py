"""The paper's workloads: networks, data formats, catalog, and short studies on generated files."""

import http.server
import io
import os
import tarfile
import threading
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow import MlflowClient

from edps_mlflow import names as n
from edps_mlflow.config import StudySpec
from edps_mlflow.data import catalog
from edps_mlflow.data.cifar import RECORD_BYTES, load_cifar10_splits
from edps_mlflow.errors import EdpsError
from edps_mlflow.models import SimpleCNN, init_fan_in_truncated_normal
from edps_mlflow.models.resnet8 import ResNet8
from edps_mlflow.optimizers import get_optimizer, optimizer_names
from edps_mlflow.pruning.snip import snip_mask
from edps_mlflow.study import ExecutionOptions, run_study
from edps_mlflow.workloads import WORKLOADS, get_workload

from test_data import make_mnist


def make_cifar(directory: Path, per_batch: int = 60, layout: str = "folder", seed: int = 0) -> np.ndarray:
    """CIFAR-10 binary batches: 1 label byte + 3,072 pixel bytes per record."""
    rng = np.random.default_rng(seed)
    batches = {}
    for i in range(1, 6):
        records = np.empty((per_batch, RECORD_BYTES), dtype=np.uint8)
        records[:, 0] = rng.integers(0, 10, per_batch)
        records[:, 1:] = rng.integers(0, 256, (per_batch, RECORD_BYTES - 1))
        batches[f"data_batch_{i}.bin"] = records.tobytes()
    directory.mkdir(parents=True, exist_ok=True)
    if layout == "tar":
        with tarfile.open(directory / "cifar-10-binary.tar.gz", "w:gz") as bundle:
            for name, raw in batches.items():
                info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
                info.size = len(raw)
                bundle.addfile(info, io.BytesIO(raw))
    else:
        target = directory / "cifar-10-batches-bin" if layout == "folder" else directory
        target.mkdir(parents=True, exist_ok=True)
        for name, raw in batches.items():
            (target / name).write_bytes(raw)
    return np.concatenate([np.frombuffer(raw, np.uint8).reshape(-1, RECORD_BYTES) for raw in batches.values()])


# ---- networks -------------------------------------------------------------------------------------
def test_parameter_counts_and_output_shapes():
    assert sum(p.numel() for p in SimpleCNN().parameters()) == 62_346
    assert sum(p.numel() for p in ResNet8().parameters()) == 75_050
    assert SimpleCNN()(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    model = ResNet8()
    x = model.conv(torch.zeros(2, 3, 32, 32))
    shapes = []
    for block in (model.block1, model.block2, model.block3):
        x = block(x)
        shapes.append(tuple(x.shape[1:]))
    assert shapes == [(16, 32, 32), (32, 16, 16), (64, 8, 8)]
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_resnet_stride_two_uses_tensorflow_same_padding():
    """Output row 0 of a stride-2 SAME conv sees input rows 0..2 (TF pads only after)."""
    block = ResNet8().block2
    x = torch.randn(1, 16, 32, 32)
    changed = x.clone()
    changed[:, :, 2, :] += 1.0
    out, out_changed = block.conv1(torch.nn.functional.pad(x, (0, 1, 0, 1))), \
        block.conv1(torch.nn.functional.pad(changed, (0, 1, 0, 1)))
    assert not torch.allclose(out[:, :, 0], out_changed[:, :, 0])
    # And the whole block agrees: row 0 of its output depends on input row 2.
    assert not torch.allclose(block(x)[:, :, 0], block(changed)[:, :, 0])


def test_downsampling_shortcut_is_pooled_and_zero_padded():
    block = ResNet8().block2
    for module in (block.conv1, block.conv2):
        torch.nn.init.zeros_(module.weight)
        torch.nn.init.zeros_(module.bias)
    x = torch.randn(2, 16, 32, 32)
    out = block(x)
    expected = torch.nn.functional.avg_pool2d(torch.relu(x), 2)
    assert torch.allclose(out[:, :16], expected) and torch.all(out[:, 16:] == 0)


@pytest.mark.parametrize("factory", [SimpleCNN, ResNet8])
def test_fan_in_truncated_normal_initialisation(factory):
    model = factory()
    init_fan_in_truncated_normal(model, torch.Generator().manual_seed(0))
    for name, parameter in model.named_parameters():
        if name.endswith("bias"):
            assert torch.all(parameter == 0)
        else:
            std = (1.0 / parameter[0].numel()) ** 0.5
            assert parameter.abs().max() <= 2 * std / 0.87962566103423978 + 1e-6
            assert parameter.std().item() == pytest.approx(std, rel=0.15)


@pytest.mark.parametrize("sparsity", [0.5, 0.7, 0.9])
def test_snip_on_resnet8_keeps_exactly_k_and_prunes_biases(sparsity):
    model = ResNet8()
    init_fan_in_truncated_normal(model, torch.Generator().manual_seed(1))
    generator = torch.Generator().manual_seed(2)
    mask = snip_mask(model, torch.randn(200, 3, 32, 32, generator=generator),
                     torch.randint(0, 10, (200,), generator=generator), sparsity,
                     get_workload("cifar10-resnet8").loss)
    assert mask.kept == round(75_050 * (1 - sparsity))
    assert all(mask.tensors[n].sum() == 0 for n in mask.tensors if n.endswith("bias"))


def test_search_spaces_per_workload():
    cifar = get_workload("cifar10-resnet8")
    assert cifar.search_space("nesterov").names == ("learning_rate", "momentum", "decay_steps",
                                                     "end_learning_rate_factor")
    assert cifar.search_space("momentum").names == ("learning_rate", "momentum")
    for point in cifar.search_space("nesterov").points(16):
        assert 30_000 <= point["decay_steps"] <= 60_000 and point["decay_steps"] == int(point["decay_steps"])
        assert 1e-4 <= point["end_learning_rate_factor"] <= 0.1
    # Every other optimizer tunes in its default space (optimizers/); an unknown name is one line.
    assert cifar.search_space("adamw").names == ("learning_rate", "weight_decay")
    assert cifar.search_space("lion") == get_optimizer("lion").space
    with pytest.raises(EdpsError, match="unknown optimizer 'lbfgs'; known optimizers: sgd, momentum, nesterov"):
        cifar.search_space("lbfgs")
    assert {(w.goal_error, w.max_steps) for n, w in WORKLOADS.items()
            if n not in ("digits-simple-cnn", "shakespeare-char-transformer")} == \
        {(0.02, 40_000), (0.12, 40_000), (0.40, 100_000)}


def test_a_workload_written_against_the_old_space_names_still_tunes_the_same_spaces():
    """Workloads of one's own once named search.PAPER_SPACES, ADAM_SPACES or DEFAULT_SPACES (the example did):
    they are still there, the registered optimizers' default spaces, so such a workload tunes what it did."""
    from edps_mlflow.search import ADAM_SPACES, DEFAULT_SPACES, PAPER_SPACES

    digits = get_workload("digits-simple-cnn")
    old_style = replace(digits, name="old-style", search_spaces={**PAPER_SPACES, **ADAM_SPACES})
    assert set(PAPER_SPACES) | set(ADAM_SPACES) < set(DEFAULT_SPACES) == set(optimizer_names())
    for optimizer in DEFAULT_SPACES:
        assert old_style.search_space(optimizer) == digits.search_space(optimizer) == DEFAULT_SPACES[optimizer]


# ---- CIFAR-10 binary ------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["folder", "loose", "tar"])
def test_cifar_binary_loads_in_every_layout(tmp_path, layout):
    records = make_cifar(tmp_path, layout=layout)
    splits = load_cifar10_splits(tmp_path)
    assert splits.train_images.shape == (270, 3, 32, 32) and splits.validation_images.shape == (30, 3, 32, 32)
    assert sorted(torch.cat([splits.train_labels, splits.validation_labels]).tolist()) == sorted(records[:, 0].tolist())
    # Per-channel normalisation by the training split's own statistics.
    means = splits.train_images.mean(dim=(0, 2, 3))
    stds = splits.train_images.std(dim=(0, 2, 3))
    assert torch.allclose(means, torch.zeros(3), atol=1e-4) and torch.allclose(stds, torch.ones(3), atol=1e-2)


def test_cifar_record_layout_is_channel_planes_in_row_major_order():
    """The binary format: a label byte, then 1,024 red, 1,024 green and 1,024 blue bytes, each plane
    row by row. Marked pixels must land at (channel, row, column) after parsing."""
    from edps_mlflow.data.cifar import parse_batch

    record = np.zeros(RECORD_BYTES, dtype=np.uint8)
    record[0] = 7
    record[1 + 0 * 1024 + 1 * 32 + 2] = 11  # red plane, row 1, column 2
    record[1 + 1 * 1024 + 3 * 32 + 4] = 22  # green plane, row 3, column 4
    record[1 + 2 * 1024 + 31 * 32 + 0] = 33  # blue plane, row 31, column 0
    images, labels = parse_batch(record.tobytes() * 2, "marked.bin")
    assert images.shape == (2, 3, 32, 32) and labels.tolist() == [7, 7]
    assert np.count_nonzero(images[0]) == 3
    assert images[0, 0, 1, 2] == 11 and images[0, 1, 3, 4] == 22 and images[0, 2, 31, 0] == 33


def test_cifar_truncated_mislabelled_and_missing(tmp_path):
    make_cifar(tmp_path, layout="loose")
    path = tmp_path / "data_batch_3.bin"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(EdpsError, match="data_batch_3.bin is truncated or corrupt"):
        load_cifar10_splits(tmp_path)
    make_cifar(tmp_path, layout="loose")
    raw = bytearray(path.read_bytes())
    raw[RECORD_BYTES] = 11
    path.write_bytes(bytes(raw))
    with pytest.raises(EdpsError, match="label 11"):
        load_cifar10_splits(tmp_path)
    with pytest.raises(EdpsError, match="CIFAR-10 files missing in .*cifar-10-binary.tar.gz"):
        load_cifar10_splits(tmp_path / "empty")


def test_cifar_truncated_archive(tmp_path):
    make_cifar(tmp_path, layout="tar")
    archive = tmp_path / "cifar-10-binary.tar.gz"
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(EdpsError, match="truncated or corrupt"):
        load_cifar10_splits(tmp_path)


# ---- catalog: status and download -----------------------------------------------------------------
def test_data_list_reports_present_missing_and_corrupt(tmp_path, capsys, monkeypatch):
    from edps_mlflow.cli import main

    make_mnist(tmp_path / "mnist")
    make_cifar(tmp_path / "cifar10", layout="tar")
    make_mnist(tmp_path / "fashion-mnist", compress=False)
    broken = tmp_path / "fashion-mnist" / "train-images-idx3-ubyte"
    broken.write_bytes(broken.read_bytes()[:1000])
    main(["data", "list", "--data-dir", str(tmp_path)])
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert set(lines) == set(WORKLOADS)
    assert " present " in lines["mnist-simple-cnn"] and "differ from the published files" in lines["mnist-simple-cnn"]
    assert " corrupt " in lines["fashion-mnist-simple-cnn"] and "truncated" in lines["fashion-mnist-simple-cnn"]
    assert " present " in lines["cifar10-resnet8"] and "270 train / 30 validation" in lines["cifar10-resnet8"]
    (tmp_path / "cifar10" / "cifar-10-binary.tar.gz").unlink()
    main(["data", "list", "--data-dir", str(tmp_path)])
    assert " missing " in [l for l in capsys.readouterr().out.splitlines() if l.startswith("cifar10")][0]


@pytest.fixture
def file_server(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_download_refuses_a_checksum_mismatch_and_writes_nothing(tmp_path, file_server, monkeypatch, capsys):
    from edps_mlflow.cli import main

    served, url = file_server
    make_mnist(served)  # valid IDX files, but not the published ones
    monkeypatch.setenv(catalog.MIRROR_ENV, url)
    data_dir = tmp_path / "data"
    with pytest.raises(SystemExit) as exit_info:
        main(["data", "download", "mnist", "--data-dir", str(data_dir)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "checksum mismatch" in error[0] and "download it by hand" in error[0]
    assert not data_dir.exists() or not any(data_dir.rglob("*.gz"))


def test_download_verifies_and_places_files(tmp_path, file_server, monkeypatch):
    served, url = file_server
    make_mnist(served)
    monkeypatch.setenv(catalog.MIRROR_ENV, url)
    source = catalog.SOURCES["mnist"]
    files = tuple(replace(f, md5=catalog.md5_of(served / f.name)) for f in source.files)
    directory = catalog.download(replace(source, files=files), tmp_path / "data", report=lambda line: None)
    assert directory == tmp_path / "data" / "mnist"
    assert sorted(p.name for p in directory.iterdir()) == ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"]
    assert catalog.load_dataset("mnist", tmp_path / "data").train_size == 180


def test_download_offline_says_where_to_put_the_files(tmp_path, monkeypatch):
    monkeypatch.setenv(catalog.MIRROR_ENV, "http://127.0.0.1:9/")  # the discard port: refused at once
    with pytest.raises(EdpsError, match=r"put it in .*cifar10"):
        catalog.download(catalog.SOURCES["cifar10"], tmp_path, timeout=5, report=lambda line: None)
    assert not (tmp_path / "cifar10").exists()


def test_download_into_a_read_only_folder_says_so_before_asking_any_server(tmp_path):
    """The folder made read-only by a bind mount in a mount namespace of its own (root alone ignores modes); the
    mirror is a server that would never answer, so only a refusal made before any request ends in time."""
    import subprocess
    import sys

    folder = tmp_path / "data" / "mnist"
    folder.mkdir(parents=True)
    script = ("from edps_mlflow.cli import main; main(['data', 'download', 'mnist', '--data-dir', "
              f"{str(tmp_path / 'data')!r}])")
    mount = f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder}"
    result = subprocess.run(["unshare", "-m", "sh", "-c", f"{mount} && exec {sys.executable} -c \"{script}\""],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, catalog.MIRROR_ENV: "http://10.255.255.1/"})
    if "mount" in result.stderr or "unshare" in result.stderr:
        pytest.skip(f"no read-only bind mount here: {result.stderr.strip()[:200]}")
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert line.startswith(f"edps: error: cannot write in {folder}: ") and "Read-only file system" in line, line
    assert "downloading" not in result.stdout


# ---- short studies on generated files -------------------------------------------------------------
@pytest.mark.parametrize("workload,maker", [
    ("fashion-mnist-simple-cnn", lambda d: make_mnist(d / "fashion-mnist", count=300)),
    ("cifar10-resnet8", lambda d: make_cifar(d / "cifar10", layout="tar")),
])
def test_short_study_end_to_end_on_generated_files(workload, maker, tmp_path, sqlite_store):
    maker(tmp_path)
    optimizer = "nesterov" if workload.startswith("cifar") else "momentum"
    spec = StudySpec(workload, optimizer, sparsity=0.5, batch_size=16, trials=2, goal_error=0.95, max_steps=20,
                     check_interval=10, seed=0)
    out = io.StringIO()
    # Generated files are not the published ones: trained on only when accepted, and every run says so.
    outcome = run_study(spec, ExecutionOptions(workers=1, threads=1, data_dir=str(tmp_path), experiment=workload,
                                               accept_unverified_data=True), out=out)
    # Random labels: about 90% error, so a 0.95 goal is met at the first check.
    assert outcome.steps_to_result == 10, out.getvalue()
    assert len(outcome.records) == 2
    client = MlflowClient(sqlite_store)
    runs = [r for r in client.search_runs([outcome.experiment_id])
            if r.data.tags.get(n.TAG_KIND) in (n.KIND_STUDY, n.KIND_TRIAL)]
    assert len(runs) == 3 and all("expected md5" in r.data.tags[n.TAG_UNVERIFIED_DATA] for r in runs)
    # The run page cuts the tag's key to a few letters: the study's description says it in words, below its result.
    study_run = next(r for r in runs if r.data.tags[n.TAG_KIND] == n.KIND_STUDY)
    lines = study_run.data.tags[n.MLFLOW_NOTE].split("\n\n")
    assert lines[1] == f"**Unverified data** (not the published files; `--accept-unverified-data true`): " \
                       f"{study_run.data.tags[n.TAG_UNVERIFIED_DATA]}.", lines
    assert "warning: unverified data, recorded on every run: " in out.getvalue()
