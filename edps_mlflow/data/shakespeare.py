"""Character-level Tiny Shakespeare (Karpathy's char-rnn ``input.txt``) as windows of character ids.

Ids come from the fixed ``ALPHABET`` of the real file, so the vocabulary is known before any data is read.
The first 90% of the characters train, the last 10% validate (char-rnn's and nanoGPT's split), each cut into
consecutive windows of ``CONTEXT`` + 1 characters overlapping by one (inputs, and targets shifted by one);
validation uses the first ``VALIDATION_WINDOWS`` windows, all of them at every check (docs/workloads.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from edps_mlflow.data.bounded import read_file
from edps_mlflow.data.splits import DataSplits
from edps_mlflow.errors import EdpsError

FILE = "input.txt"
# The 65 characters of the published file, in sorted order: a character's id is its position.
ALPHABET = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# Characters each example predicts (its context: the network sees at most this many).
CONTEXT = 32
# 32,768 characters: on a CPU a pass over the whole 10% costs as much as a hundred training steps at batch 16.
VALIDATION_WINDOWS = 1024
TRAIN_FRACTION = 0.9
# The real file's size; a text far larger is not this corpus (and would not fit a window tensor's budget).
PUBLISHED_CHARACTERS = 1_115_394
MAX_BYTES = 16 * PUBLISHED_CHARACTERS

_IDS = np.full(256, -1, dtype=np.int64)
_IDS[np.frombuffer(ALPHABET.encode("ascii"), dtype=np.uint8)] = np.arange(len(ALPHABET))


def encode(data: bytes, source: str = "the text") -> np.ndarray:
    """Character ids of ASCII ``data``; one line naming the first character outside ``ALPHABET``."""
    ids = _IDS[np.frombuffer(bytes(data), dtype=np.uint8)]
    unknown = np.flatnonzero(ids < 0)
    if len(unknown):
        position = int(unknown[0])
        raise EdpsError(f"{source} holds {bytes(data[position:position + 1])!r} at byte {position}, which is not "
                        f"a character of Tiny Shakespeare (its 65 are letters, digits 3, space, newline and "
                        f"!$&',-.:;?)")
    return ids


def decode(ids: np.ndarray | torch.Tensor) -> str:
    return "".join(ALPHABET[int(i)] for i in np.asarray(ids).reshape(-1))


def windows(ids: np.ndarray, context: int = CONTEXT) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each [N, context] int64: consecutive windows, the targets shifted by one."""
    count = (len(ids) - 1) // context
    inputs = ids[:count * context].reshape(count, context)
    targets = ids[1:count * context + 1].reshape(count, context)
    return torch.from_numpy(inputs.copy()), torch.from_numpy(targets.copy())


def split_text(ids: np.ndarray, context: int = CONTEXT, source: str = "the text") -> DataSplits:
    """The first 90% of the characters train, the first VALIDATION_WINDOWS windows of the last 10% validate (all
    of them when there are fewer)."""
    boundary = int(len(ids) * TRAIN_FRACTION)
    train, validation = ids[:boundary], ids[boundary:]
    if len(validation) < context + 1:
        raise EdpsError(f"{source} has {len(ids)} characters; its last 10% must hold at least one window of "
                        f"{context + 1}, so at least {10 * (context + 1)} are needed")
    train_inputs, train_targets = windows(train, context)
    validation_inputs, validation_targets = windows(validation, context)
    return DataSplits(train_inputs, train_targets, validation_inputs[:VALIDATION_WINDOWS],
                      validation_targets[:VALIDATION_WINDOWS])


def load_shakespeare_splits(directory: Path, context: int = CONTEXT) -> DataSplits:
    """``<directory>/input.txt`` as training and validation windows."""
    path = directory / FILE
    if not path.exists():
        raise EdpsError(f"{path} does not exist (`edps data download tiny-shakespeare` fetches it)")
    data = read_file(path, MAX_BYTES)
    if len(data) > MAX_BYTES:
        raise EdpsError(f"{path} holds more than {MAX_BYTES} bytes: it is not Tiny Shakespeare "
                        f"({PUBLISHED_CHARACTERS} characters)")
    return split_text(encode(bytes(data), str(path)), context, str(path))
