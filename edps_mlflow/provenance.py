"""Where a measurement came from: the user, the command, and the code (git commit and whether the working tree
had uncommitted changes). Imports neither torch nor MLflow."""

from __future__ import annotations

import functools
import getpass
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from edps_mlflow import __version__

_PACKAGE_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class CodeVersion:
    commit: str | None  # None: not run from a git checkout (an installed wheel)
    dirty: bool  # uncommitted changes in the checkout

    @property
    def label(self) -> str:
        """``0.1.0+g1a2b3c4d5e6f`` (``.dirty`` appended when the checkout had changes)."""
        if self.commit is None:
            return __version__
        return f"{__version__}+g{self.commit[:12]}" + (".dirty" if self.dirty else "")


@functools.lru_cache(maxsize=1)
def code_version() -> CodeVersion:
    """The git commit of the checkout the package runs from, read once per process."""
    if not (_PACKAGE_ROOT / ".git").exists():
        return CodeVersion(None, False)
    try:
        commit = _git("rev-parse", "HEAD")
        # Only the package's own files count: a stray file in the checkout does not change the code.
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no", "--", "edps_mlflow", "analysis"))
    except (OSError, subprocess.SubprocessError):
        return CodeVersion(None, False)
    return CodeVersion(commit or None, dirty)


def _git(*arguments: str) -> str:
    result = subprocess.run(["git", "-C", str(_PACKAGE_ROOT), *arguments], capture_output=True, text=True,
                            timeout=10, check=True)
    return result.stdout.strip()


def user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (some containers)
        return "unknown"


def command_line() -> str:
    """The command as typed, for the run's Source (``edps study --bs 64``): the console script, the
    ``-c`` launcher and ``python -m edps_mlflow.cli`` all leave the arguments after ``sys.argv[0]``."""
    return " ".join(["edps", *(shlex.quote(a) for a in sys.argv[1:])])[:500]
