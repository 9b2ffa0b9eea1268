"""URIs as the user sees them: credentials replaced by ``***``; user information that is not validly
percent-encoded refused before any connection; local sqlite stores that do not exist; bare paths and missing folders
(store_uri). Standard library only, so that downloads, tracking and the analysis all print URIs through the same
function.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

from edps_mlflow.errors import EdpsError

# ``scheme://userinfo@host`` in free text, up to the authority's last ``@``. Text cannot say where a password with
# a quote, a space or a ``#`` ends, so the URIs we know are parsed first and their user information removed.
_USERINFO = re.compile(r"(?<=://)[^\s/?#'\"<>]*@")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_ANOTHER_URI = re.compile(r"\s[A-Za-z][A-Za-z0-9+.\-]*://")
# What follows the ``@`` of the user information: a host (a name or a bracketed IP literal), an optional
# port, then the end of the authority.
_HOST_THEN_END = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%\-]*)(?::[0-9]*)?(?:[/?#]|$)")
# Where this process's URIs come from; each may carry a user and password.
_CONFIGURED = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "EDPS_DATA_MIRROR", "RAY_ADDRESS")


def userinfo(uri: str) -> str | None:
    """The user information of ``uri`` (``user:password``), whatever characters the password holds: up to the
    last ``@`` that a host and the end of the authority follow (``u:p@ss@db/x`` gives ``u:p@ss``); None if none.
    """
    scheme = _SCHEME.match(uri.strip())
    if scheme is None:
        return None
    rest = uri.strip()[scheme.end():]
    # The last such '@' whose user name holds no '/', '?', '#' or space: not one in a path or query (sqlite:////a@b).
    for at in reversed([i for i, c in enumerate(rest) if c == "@" and i > 0]):
        if _HOST_THEN_END.match(rest, at + 1) and not re.search(r"[/?#\s]", rest[:at].split(":", 1)[0]):
            return rest[:at]
    return None


# RFC 3986's userinfo: unreserved characters, sub-delims and percent-encodings (':' only between user and password).
_USERINFO_CHARACTER = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2}")
_ENCODING_HINT = "@ as %40, / as %2F, : as %3A, % as %25, a space as %20: urllib.parse.quote(text, safe='')"


def userinfo_fault(uri: str) -> str | None:
    """Why the user information of ``uri`` is not valid RFC 3986, in words that quote none of it; None when it is
    valid or absent. Taken as its writer meant it: all before the last '@' that a host and the end of the
    authority follow, whatever it holds; a driver would cut a raw '@' or '/' elsewhere and print the pieces."""
    scheme = _SCHEME.match(uri.strip())
    rest = uri.strip()[scheme.end():] if scheme else "/"
    ats = [at for at in range(len(rest)) if rest[at] == "@" and _HOST_THEN_END.match(rest, at + 1)]
    if rest.startswith("/") or not ats:  # no authority (sqlite:////a@b/mlflow.db), or no user information
        return None
    user, colon, password = rest[:ats[-1]].partition(":")
    # A ':' in the password is RFC 3986's, and every client splits at the first one.
    for part, text in (("user name", user), ("password", password.replace(":", ""))):
        left = _USERINFO_CHARACTER.sub("", text)
        fault = ("has a character that must be percent-encoded" if left.strip("%") else
                 "has a % that two hex digits do not follow" if left else None)
        if fault:
            shown = f"{scheme.group(0)}***{':***' if colon else ''}{rest[ats[-1]:]}"
            return f"the {part} in the tracking URI {fault} ({_ENCODING_HINT}): {shown}"
    return None


def require_encoded_userinfo(uri: str) -> None:
    """Refuse a tracking URI whose user information is not validly percent-encoded (:func:`userinfo_fault`)."""
    fault = userinfo_fault(uri)
    if fault is not None:
        raise EdpsError(fault)


def _spellings(info: str) -> set[str]:
    """The user information as it was typed, percent-decoded and percent-encoded (clients print either)."""
    return {info, unquote(info), quote(info, safe=":"), quote(unquote(info), safe=":")} - {""}


def redact_uri(text: str, *uris: str) -> str:
    """Every ``scheme://user:password@host`` in ``text`` (an error message too) -> ``scheme://***:***@host``: the
    user information of ``uris`` and of the configured URIs wherever it appears, other URIs' by their syntax."""
    text = str(text)
    # A text that is itself one URI is one of the known ones.
    itself = [text] if _SCHEME.match(text.strip()) and not _ANOTHER_URI.search(text.strip()) else []
    known = [*itself, *uris, *configured_uris()]
    secrets = {spelling for uri in known if (info := userinfo(str(uri))) for spelling in _spellings(info)}
    # The longest first, so that a spelling that contains another is replaced whole.
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret + "@", ("***:***" if ":" in secret else "***") + "@")

    def replace(match: re.Match[str]) -> str:
        found = match.group(0)[:-1]
        return ("***:***" if ":" in found else "***") + "@"

    return _USERINFO.sub(replace, text)


def configured_uris() -> list[str]:
    """This process's URIs from its environment (the store's, the registry's, the data mirror's, Ray's)."""
    return [os.environ.get(name, "") for name in _CONFIGURED]


# MLflow prints "View run ... at: <host>/#/..." with the tracking URI as typed, password included; this turns it off.
_SUPPRESS_RUN_LINKS = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


def quiet_links_with_credentials(uri: str) -> None:
    """When ``uri`` carries credentials, stop MLflow from printing run links, in the environment (so that
    worker processes inherit it)."""
    if redact_uri(uri) != uri:
        os.environ.setdefault(_SUPPRESS_RUN_LINKS, "true")


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///path`` URI (None for other stores and in-memory ones)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def require_existing_store(uri: str) -> None:
    """Readers (status, doctor, analysis) refuse a local store that does not exist, instead of creating an
    empty one as MLflow would: a typo in the URI should not leave a new database behind."""
    path = sqlite_path(uri)
    # A store another process began to build (its creation lock or half-built file) is there: doctor takes it over.
    building = path is not None and (path.with_name(f"{path.name}.lock").exists()
                                     or any(path.parent.glob(f".{path.name}.*.new*")))
    if path is not None and not path.is_file() and not building:
        raise EdpsError(f"no tracking store at {redact_uri(uri)}: {path} does not exist "
                        "(point MLFLOW_TRACKING_URI, or edps-analyze's --tracking-uri, at the store the studies were "
                        "written to)")


# MLflow's tracking URIs without a scheme that are no path.
_NO_PATH = ("databricks",)


def store_uri(uri: str) -> str:
    """``uri`` as the store to open: a bare path ending ``.db`` is the sqlite store at that path (made absolute, so
    that worker processes and `mlflow run` in another directory find the same file); another bare path is refused
    with the URI to type (MLflow would take it for its retired file store), as is a ``file:`` store unless
    ``MLFLOW_ALLOW_FILE_STORE`` keeps it; a local store whose folder does not exist is refused
    (:func:`require_store_folder`). Other URIs pass unchanged."""
    if uri and not re.match(r"^[A-Za-z][A-Za-z0-9+.\-]+:", uri) and uri not in _NO_PATH:
        path = Path(uri).expanduser().absolute()
        if path.suffix != ".db":
            target = path / "mlflow.db" if path.is_dir() else path if path.is_file() else f"{path}.db"
            raise EdpsError(f"the tracking store {uri} is a path, not a URI: for a sqlite store there, type "
                            f"sqlite:///{target}")
        uri = f"sqlite:///{path}"
    require_store_folder(uri)
    if uri.startswith("file:") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        raise EdpsError(f"the tracking store {redact_uri(uri)} is MLflow's retired file store: use a sqlite store "
                        f"(sqlite:///{_local_path(uri).parent / 'mlflow.db'}), or set "
                        "MLFLOW_ALLOW_FILE_STORE=true to keep this one")
    return uri


def require_store_folder(uri: str) -> None:
    """Refuse a local store whose folder does not exist, naming the nearest folder that does: a typo in a folder
    name must not make a new store that nobody will look at. A new store in an existing folder is fine."""
    path = _local_path(uri)
    folder = path.expanduser().absolute().parent if path is not None else None
    if folder is None or folder.is_dir():
        return
    nearest = next(p for p in folder.parents if p.is_dir())
    raise EdpsError(f"no folder {folder} for the tracking store {redact_uri(uri)}: the nearest existing folder is "
                    f"{nearest}")


def _local_path(uri: str) -> Path | None:
    """The database file of a sqlite store, the folder of a file store; None for other stores."""
    return Path(unquote(urlparse(uri).path)) if uri.startswith("file:") else sqlite_path(uri)


def check_environment_store() -> None:
    """``MLFLOW_TRACKING_URI`` checked before any work (the user information, :func:`store_uri`); a bare ``.db``
    path is replaced there by the sqlite URI it means, so that MLflow and every worker process open that store."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    require_encoded_userinfo(uri)
    if uri:
        os.environ["MLFLOW_TRACKING_URI"] = store_uri(uri)
