"""File names made from values that the analysis read from a store or a CSV (a workload, an optimizer):
safe on every file system, and distinct for distinct values, so that no figure overwrites another.

    file_stem("steps", "digits-simple-cnn", "sgd")  ->  steps_digits-simple-cnn_sgd
    file_stem("steps", "a/b", "sgd")                ->  steps_a-b_sgd_<12 hex digits>

A plain value (lower-case letters, digits, '.' and '-', starting with a letter or a digit, at most 64
characters) is used as it is, so the figures of ordinary names keep the names they always had. Any other
value (a '/', '\\', '..', NUL, an upper-case letter, a space, a very long name) is cleaned to those
characters, cut short, and the stem ends in a hash of every value: two values that clean alike ('a/b' and
'a\\b', or 'SGD' and 'sgd', which a case-insensitive file system would take for one file) get different
files. The fields are joined by '_', which no cleaned value holds, so a plain stem (1 + n fields) never
equals a hashed one (2 + n fields) and the values of one stem are never read as those of another.
"""

from __future__ import annotations

import hashlib
import json
import re

_PLAIN = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}")
_NOT_PLAIN = re.compile(r"[^a-z0-9.-]+")
# A cleaned value is cut to this many characters; with the kind, the '_'s and the hash, a stem of three
# values stays far below the 255 bytes a file name may have on common file systems.
_CLEANED_LENGTH = 40
_HASH_LENGTH = 12

# The files of a figure: the PNG that reports show, and the SVG for print (here, not in plots.py, so that a
# command that hands its figures to other processes names them without importing matplotlib).
FIGURE_FORMATS = ("png", "svg")


def file_stem(kind: str, *values: object) -> str:
    """``kind_value1_value2...``, each value as it is when plain; else cleaned and a hash appended."""
    texts = [str(value) for value in values]
    if all(_PLAIN.fullmatch(text) for text in texts):
        return "_".join((kind, *texts))
    cleaned = [_NOT_PLAIN.sub("-", text.lower()).strip(".-")[:_CLEANED_LENGTH].strip(".-") or "-"
               for text in texts]
    # JSON keeps the values apart (no joined text of two values equals another pair's) and is ASCII.
    digest = hashlib.sha256(json.dumps(texts).encode("ascii")).hexdigest()[:_HASH_LENGTH]
    return "_".join((kind, *cleaned, digest))
