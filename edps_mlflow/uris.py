"""URIs as the user sees them: credentials replaced by ``***``; local sqlite stores that do not exist.

No imports beyond the standard library, so that data downloads, the tracking code and the analysis
all print URIs through the same function.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from edps_mlflow.errors import EdpsError

# ``scheme://userinfo@host``: the user information is the part of the authority (which ends at the
# first ``/``, ``?`` or ``#``) before its last ``@``, so an unencoded ``@`` in a password is covered.
_USERINFO = re.compile(r"(?<=://)[^\s/?#'\"<>]*@")


def redact_uri(text: str) -> str:
    """Every ``scheme://user:password@host`` in ``text`` -> ``scheme://***:***@host``.

    Works on any text (an error message that quotes a URL too), so that a secret is never printed.
    """
    def replace(match: re.Match[str]) -> str:
        userinfo = match.group(0)[:-1]
        return ("***:***" if ":" in userinfo else "***") + "@"

    return _USERINFO.sub(replace, str(text))


# MLflow prints "View run ... at: <host>/#/..." when a run ends, with the host taken from the tracking
# URI as typed, user and password included. This MLflow setting turns those lines off.
_SUPPRESS_RUN_LINKS = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


def quiet_links_with_credentials(uri: str) -> None:
    """When ``uri`` carries credentials, stop MLflow from printing run links (they would show them).

    Set in the environment, so the worker processes that talk to the same store inherit it.
    """
    if redact_uri(uri) != uri:
        os.environ.setdefault(_SUPPRESS_RUN_LINKS, "true")


def explain_store_error(first_line: str) -> str:
    """An MLflow error line about the store, redacted, with what to do when the server refused us."""
    text = redact_uri(first_line)
    if "error code 401" in text or "error code 403" in text:
        # MLflow's message says only that we are not authenticated, and points at its website.
        text += " (set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD for this server)"
    return text


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///path`` URI (None for other stores and in-memory ones)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def require_existing_store(uri: str) -> None:
    """Readers (status, analysis) refuse a local store that does not exist, instead of creating an
    empty one as MLflow would: a typo in the URI should not leave a new database behind."""
    path = sqlite_path(uri)
    if path is not None and not path.is_file():
        raise EdpsError(f"no tracking store at {redact_uri(uri)}: {path} does not exist "
                        "(set MLFLOW_TRACKING_URI or --tracking-uri to the store the studies were written to)")
