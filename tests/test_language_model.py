"""The character-level language-model workload: Tiny Shakespeare's loader on text generated here in the real
file's format (the real file is not fetched by the tests), the decoder-only transformer, and a loss-goal
study of it trained with Adam through both engine paths."""

from __future__ import annotations

import http.server
import threading
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from edps_mlflow.config import StudySpec, TrialSpec
from edps_mlflow.data import shakespeare
from edps_mlflow.data import catalog
from edps_mlflow.data.catalog import SOURCES, DatasetStatus, dataset_report, load_dataset
from edps_mlflow.engine import EngineSettings, LocalStepBound, train_trials
from edps_mlflow.errors import EdpsError
from edps_mlflow.models.char_transformer import CharTransformer
from edps_mlflow.results import TrialStatus
from edps_mlflow.trials import prepare_trial
from edps_mlflow.workloads import GoalMetric, InputLayout, get_workload

WORDS = ("thou", "art", "the", "king", "and", "my", "lord", "speak", "good", "night", "sweet", "love", "what", "is")
SPEAKERS = ("ROMEO", "JULIET", "First Citizen", "KING RICHARD III", "All")


def generated_play(characters: int, seed: int = 0) -> str:
    """Text in the format of Tiny Shakespeare: a speaker's name and a colon on a line, then lines of speech,
    then a blank line; only characters of the real file's alphabet."""
    rng = np.random.default_rng(seed)
    parts: list[str] = []
    while sum(map(len, parts)) < characters:
        lines = [" ".join(rng.choice(WORDS, rng.integers(3, 9))).capitalize() + rng.choice([".", ",", "!", "?", ";"])
                 for _ in range(rng.integers(1, 4))]
        parts.append(f"{rng.choice(SPEAKERS)}:\n" + "\n".join(lines) + "\n\n")
    return "".join(parts)[:characters]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    directory = tmp_path / "tiny-shakespeare"
    directory.mkdir()
    (directory / shakespeare.FILE).write_text(generated_play(40_000))
    return tmp_path


def test_the_loader_cuts_the_text_into_shifted_windows(corpus):
    text = (corpus / "tiny-shakespeare" / shakespeare.FILE).read_text()
    splits = load_dataset("tiny-shakespeare", corpus)
    boundary = int(len(text) * 0.9)
    assert splits.train_size == (boundary - 1) // shakespeare.CONTEXT
    assert splits.validation_size == min(shakespeare.VALIDATION_WINDOWS, (len(text) - boundary - 1) // shakespeare.CONTEXT)
    # Window i's targets are its inputs shifted by one character; consecutive windows continue the text.
    assert shakespeare.decode(splits.train_images[0]) == text[:shakespeare.CONTEXT]
    assert shakespeare.decode(splits.train_labels[0]) == text[1:shakespeare.CONTEXT + 1]
    assert shakespeare.decode(splits.train_images[1]) == text[shakespeare.CONTEXT:2 * shakespeare.CONTEXT]
    assert shakespeare.decode(splits.validation_images[0]) == text[boundary:boundary + shakespeare.CONTEXT]
    assert splits.train_images.dtype == torch.int64 and splits.train_images.shape[1] == shakespeare.CONTEXT
    # The published file's sizes give the workload's declared split sizes.
    workload = get_workload("shakespeare-char-transformer")
    assert workload.train_size == (int(shakespeare.PUBLISHED_CHARACTERS * 0.9) - 1) // shakespeare.CONTEXT
    assert workload.validation_size == shakespeare.VALIDATION_WINDOWS


def test_bad_text_is_one_line(corpus, tmp_path):
    path = corpus / "tiny-shakespeare" / shakespeare.FILE
    path.write_text("ROMEO:\nThou art caf\u00e9.\n")
    with pytest.raises(EdpsError, match=r"holds b'\\xc3' at byte 19, which is not a character of Tiny Shakespeare"):
        load_dataset("tiny-shakespeare", corpus)
    path.write_text("ROMEO:\nHi.\n")
    with pytest.raises(EdpsError, match="its last 10% must hold at least one window of 33"):
        load_dataset("tiny-shakespeare", corpus)
    with pytest.raises(EdpsError, match="tiny-shakespeare"):
        load_dataset("tiny-shakespeare", tmp_path / "nowhere")


def test_the_published_checksum_is_checked(corpus):
    remote = SOURCES["tiny-shakespeare"].files[0]
    assert remote.md5 is None and remote.sha256 is not None and len(remote.sha256) == 64
    report = dataset_report("tiny-shakespeare", corpus)
    # Generated text loads, but it is not the published file: the report says so.
    assert report.status is DatasetStatus.PRESENT and report.detail.endswith(
        f"loads, but {shakespeare.FILE} differs from the published file (checksum)")
    assert not remote.matches(corpus / "tiny-shakespeare" / shakespeare.FILE)


def test_download_checks_the_published_sha256_then_places_the_file(tmp_path, monkeypatch):
    """`edps data download tiny-shakespeare` from a mirror on this machine (the real host is not reached by the
    tests): generated text is refused for its sha256, then accepted when the checksum is its own."""
    served = tmp_path / "served"
    served.mkdir()
    (served / shakespeare.FILE).write_text(generated_play(5_000))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv(catalog.MIRROR_ENV, f"http://127.0.0.1:{server.server_address[1]}/")
        source = SOURCES["tiny-shakespeare"]
        with pytest.raises(EdpsError, match=f"checksum mismatch \\(expected sha256 {source.files[0].sha256}, got sha256 "):
            catalog.download(source, tmp_path / "data", report=lambda line: None)
        assert not (tmp_path / "data" / "tiny-shakespeare" / shakespeare.FILE).exists()
        own = replace(source, files=(replace(source.files[0], sha256=catalog.sha256_of(served / shakespeare.FILE)),))
        directory = catalog.download(own, tmp_path / "data", report=lambda line: None)
    finally:
        server.shutdown()
    assert load_dataset("tiny-shakespeare", tmp_path / "data").train_size == (4_500 - 1) // shakespeare.CONTEXT
    assert directory == tmp_path / "data" / "tiny-shakespeare"


def test_the_transformer_is_causal_and_its_initialisation_seeded():
    workload = get_workload("shakespeare-char-transformer")
    model = workload.build_model()
    assert isinstance(model, CharTransformer) and sum(p.numel() for p in model.parameters()) == 30_721
    workload.initialise(model, torch.Generator().manual_seed(1))
    ids = torch.randint(0, len(shakespeare.ALPHABET), (2, shakespeare.CONTEXT), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % len(shakespeare.ALPHABET)
    with torch.no_grad():
        before, after = model(ids), model(changed)
    assert before.shape == (2, shakespeare.CONTEXT, len(shakespeare.ALPHABET))
    assert torch.equal(before[:, :20], after[:, :20]) and not torch.equal(before[:, 20:], after[:, 20:])
    again = workload.build_model()
    workload.initialise(again, torch.Generator().manual_seed(1))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_a_loss_goal_study_with_adam_gives_the_same_outcomes_packed_and_alone(corpus):
    """Three Adam trials on the generated play (a few hundred windows): each check's value is the mean
    validation cross-entropy in nats per character; the packed path and lone trials reach the goal at the
    same steps."""
    base = get_workload("shakespeare-char-transformer")
    assert base.goal_metric is GoalMetric.LOSS and base.input_layout is InputLayout.TOKENS
    data = load_dataset("tiny-shakespeare", corpus)
    data = replace(data, validation_images=data.validation_images[:64], validation_labels=data.validation_labels[:64])
    workload = replace(base, name="generated-play", load_data=lambda _: data, needs_data_dir=False,
                       train_size=data.train_size, validation_size=data.validation_size)
    goal, steps, interval = 2.9, 80, 10  # nats per character: a uniform guess over 65 characters is 4.17
    spec = StudySpec("shakespeare-char-transformer", "adam", 0.0, 32, 3, goal, steps, interval, 0)
    points = [{"learning_rate": rate} for rate in (0.01, 0.003, 0.03)]
    setups = [prepare_trial(workload, data, TrialSpec(spec, index, point)) for index, point in enumerate(points)]
    settings = EngineSettings(32, steps, interval, (workload.goal_bound(goal, data.validation_size),), 0)
    packed = train_trials(workload, data, setups, settings, LocalStepBound(steps, interval, False))
    alone = [result for setup in setups
             for result in train_trials(workload, data, [setup], settings, LocalStepBound(steps, interval, False))]

    def outcomes(results):
        return [(r.index, r.status, r.steps_to_result) for r in sorted(results, key=lambda r: r.index)]

    assert outcomes(packed) == outcomes(alone)
    assert any(r.status is TrialStatus.REACHED for r in alone), outcomes(alone)
