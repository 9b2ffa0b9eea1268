import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from edps_mlflow.data.digits import load_digits_splits
from edps_mlflow.data.idx import load_idx_splits, read_idx, resolve_data_dir
from edps_mlflow.errors import EdpsError
from edps_mlflow.workloads import get_workload


def write_idx(path: Path, array: np.ndarray, compress: bool) -> Path:
    """The real IDX layout: 0, 0, type 0x08, rank, big-endian sizes, then the bytes."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", n) for n in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as handle:
            handle.write(payload)
    else:
        path.write_bytes(payload)
    return path


def make_mnist(directory: Path, count: int = 200, compress: bool = True, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=count, dtype=np.uint8)
    write_idx(directory / "train-images-idx3-ubyte", images, compress)
    write_idx(directory / "train-labels-idx1-ubyte", labels, compress)
    return images, labels


@pytest.mark.parametrize("compress", [True, False])
def test_mnist_idx_files_load_split_and_normalise(tmp_path, compress):
    images, labels = make_mnist(tmp_path, compress=compress)
    splits = load_idx_splits(Path(tmp_path), "MNIST", mean=0.1307, std=0.3081)
    assert splits.train_images.shape == (180, 1, 28, 28) and splits.validation_images.shape == (20, 1, 28, 28)
    assert splits.train_images.dtype == torch.float32 and splits.train_labels.dtype == torch.int64
    assert 0 <= int(splits.train_labels.min()) and int(splits.train_labels.max()) <= 9
    # Normalisation: (x / 255 - mean) / std, on a pixel we can find again.
    everything = torch.cat([splits.train_images, splits.validation_images]).flatten()
    expected = (torch.from_numpy(images.astype(np.float32)).flatten() / 255 - 0.1307) / 0.3081
    assert torch.allclose(everything.sort().values, expected.sort().values, atol=1e-5)
    # The split is a fixed seeded shuffle: the same every time.
    again = load_idx_splits(Path(tmp_path), "MNIST", mean=0.1307, std=0.3081)
    assert torch.equal(again.validation_labels, splits.validation_labels)


def test_missing_directory_names_it_and_the_files(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(EdpsError) as error:
        load_idx_splits(Path(missing), "MNIST", 0.1307, 0.3081)
    message = str(error.value)
    assert str(missing) in message and "train-images-idx3-ubyte" in message and "train-labels-idx1-ubyte" in message


def test_missing_labels_file_is_named(tmp_path):
    make_mnist(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(EdpsError, match=r"files missing in .*train-labels-idx1-ubyte"):
        load_idx_splits(Path(tmp_path), "MNIST", 0.1307, 0.3081)


def test_truncated_file_is_refused(tmp_path):
    make_mnist(tmp_path, compress=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(EdpsError, match="truncated or corrupt"):
        load_idx_splits(Path(tmp_path), "MNIST", 0.1307, 0.3081)


def test_truncated_gzip_is_refused(tmp_path):
    make_mnist(tmp_path, compress=True)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-50])
    with pytest.raises(EdpsError, match="cannot read|truncated"):
        load_idx_splits(Path(tmp_path), "MNIST", 0.1307, 0.3081)


def test_mislabelled_files_are_refused(tmp_path):
    make_mnist(tmp_path, compress=False)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.full(150, 3, dtype=np.uint8), compress=False)
    with pytest.raises(EdpsError, match="200 images but .* 150 labels"):
        load_idx_splits(Path(tmp_path), "MNIST", 0.1307, 0.3081)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.full(200, 12, dtype=np.uint8), compress=False)
    with pytest.raises(EdpsError, match="label 12"):
        load_idx_splits(Path(tmp_path), "MNIST", 0.1307, 0.3081)


def test_wrong_image_shape_and_magic(tmp_path):
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((10, 32, 32), dtype=np.uint8), compress=False)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(10, dtype=np.uint8), compress=False)
    with pytest.raises(EdpsError, match="28x28"):
        load_idx_splits(Path(tmp_path), "MNIST", 0.1307, 0.3081)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04garbage")
    with pytest.raises(EdpsError, match="bad magic"):
        read_idx(tmp_path / "bad", 1)


def test_data_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("EDPS_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir(tmp_path / "flag") == tmp_path / "flag"
    assert resolve_data_dir(None) == tmp_path / "env"
    monkeypatch.delenv("EDPS_DATA_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert resolve_data_dir(None) == tmp_path / "cache" / "edps-mlflow" / "data"


def test_digits_split_is_fixed_and_normalised():
    first, second = load_digits_splits(), load_digits_splits()
    assert first.train_size == 1618 and first.validation_size == 179
    assert torch.equal(first.validation_labels, second.validation_labels)
    assert abs(float(first.train_images.mean())) < 1e-4 and abs(float(first.train_images.std()) - 1) < 1e-3


def test_mnist_workload_is_the_paper_network(tmp_path):
    workload = get_workload("mnist-simple-cnn")
    assert sum(p.numel() for p in workload.build_model().parameters()) == 62_346
    assert (workload.goal_error, workload.max_steps) == (0.02, 40_000)
    make_mnist(tmp_path)
    data = workload.load_data(tmp_path)
    assert workload.build_model()(data.validation_images).shape == (20, 10)
    assert workload.allowed_errors(0.02, 6000) == 120


def test_digits_are_scikit_learns_read_without_importing_it(monkeypatch):
    """The digits table read from scikit-learn's file equals load_digits' exactly (pixels and labels), without
    importing scikit-learn (a CPU-second per training process); where the file is not found, load_digits."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from edps_mlflow.data import digits

    bunch = load_digits()
    expected = np.column_stack([bunch.data, bunch.target])
    table = digits.digits_table()
    assert table.dtype == expected.dtype and np.array_equal(table, expected)
    imported = subprocess.run([sys.executable, "-c", "import sys; from edps_mlflow.data.digits import "
                               "load_digits_splits; load_digits_splits(); print('sklearn' in sys.modules)"],
                              capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "False"
    monkeypatch.setattr(digits.importlib.util, "find_spec", lambda name: None)
    assert np.array_equal(digits.digits_table(), expected)
