"""The one device check (resources.py): names, CUDA availability, the default device."""

import pytest
import torch

from edps_mlflow.errors import EdpsError
from edps_mlflow.resources import check_device_name, cuda_devices, device_type, resolve_device, sweep_layout
from edps_mlflow.sweep import SweepOptions

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")


@pytest.mark.parametrize("name", [None, "cpu", "cuda", "cuda:0", "cuda:12"])
def test_a_study_names_cpu_cuda_or_cuda_n(name):
    check_device_name(name)


@pytest.mark.parametrize("name", ["mps", "gpu", "CUDA", "cuda:", "cuda:x", "cpu:0", "cuda:-1", " cpu", ""])
def test_other_device_names_are_refused_in_one_line(name):
    with pytest.raises(EdpsError, match=r"^unknown device .*; use cpu, cuda or cuda:N$"):
        check_device_name(name)


def test_a_sweep_device_has_no_index():
    """A sweep spreads its studies over every GPU itself."""
    check_device_name("cuda", indexed=False)
    with pytest.raises(EdpsError, match=r"^unknown device 'cuda:0'; use cpu or cuda$"):
        SweepOptions(device="cuda:0")
    with pytest.raises(EdpsError, match="unknown device 'tpu'"):
        sweep_layout("tpu", None, 4)


def test_device_type_of_a_resolved_device():
    assert [device_type(d) for d in ("cpu", "cuda", "cuda:3")] == ["cpu", "cuda", "cuda"]


def test_the_cpu_uses_no_cuda_device():
    assert cuda_devices("cpu") == 0 and cuda_devices("cpu", indexed=False) == 0
    assert resolve_device("cpu") == torch.device("cpu")
    assert sweep_layout("cpu", 2, 4).devices == ("cpu", "cpu")


@no_cuda
@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_without_a_cuda_device_is_refused(name):
    with pytest.raises(EdpsError, match=f"^device {name} requested but no CUDA device is available$"):
        cuda_devices(name)
    with pytest.raises(EdpsError, match="no CUDA device is available"):
        resolve_device(name)


@no_cuda
def test_no_device_named_means_cuda_when_available():
    assert cuda_devices(None) == 0
    assert resolve_device(None) == torch.device("cpu")
    with pytest.raises(EdpsError, match="no CUDA device is available"):
        sweep_layout("cuda", None, 4)


def test_a_device_index_must_exist(monkeypatch):
    """Counted without a GPU here: the rule is ours, the count torch's (resources.gpu_count)."""
    from edps_mlflow import resources

    monkeypatch.setattr(resources, "gpu_count", lambda: 2)
    assert cuda_devices(None) == cuda_devices("cuda") == cuda_devices("cuda:1") == 2
    with pytest.raises(EdpsError, match=r"^device cuda:2 requested but there are only 2 CUDA devices$"):
        cuda_devices("cuda:2")
    assert sweep_layout(None, None, 4).devices == ("cuda:0", "cuda:1")
    assert cuda_devices("cpu") == 0


@pytest.mark.parametrize("arguments,message", [
    (["--device", "cuda:0"], "unknown device 'cuda:0'; use cpu or cuda"),
    (["--device", "cuda"], "no CUDA device is available"),
    (["--adaptive", "--device", "cuda"], "no CUDA device is available"),
])
def test_a_sweep_refuses_its_device_before_any_work(arguments, message, sqlite_uri, monkeypatch, capsys):
    from pathlib import Path

    from edps_mlflow.cli import main

    if "cuda" in arguments and torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    monkeypatch.setenv("EDPS_TRAINING_ENVIRONMENT", "1")  # no re-exec: we run in this process
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", "--batch-sizes", "16,32", "--sparsities", "0", *arguments])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edps: error: ") and message in lines[0], lines
    assert not Path(sqlite_uri.removeprefix("sqlite:///")).exists()
