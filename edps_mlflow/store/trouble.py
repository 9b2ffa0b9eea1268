"""A store error as the one line a user sees: the store, without secrets, and the cause; for a store that is
locked (by which process), read-only or full, what to do."""

from __future__ import annotations

import errno
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Iterator

from mlflow.exceptions import MlflowException
from mlflow.tracking import get_tracking_uri

from edps_mlflow import locks
from edps_mlflow.errors import EdpsError
from edps_mlflow.uris import configured_uris, redact_uri, sqlite_path, userinfo


def describe_store_error(uri: str, error: BaseException) -> str:
    """The one line for a store error: the store and the cause (locked, read-only, full, else store_error_text)."""
    trouble = store_trouble(error)
    if trouble is not None:
        return trouble_line(uri, trouble, error)
    return f"tracking store {redact_uri(str(uri))}: {store_error_text(error, str(uri))}"


def store_error_text(error: BaseException, *uris: str) -> str:
    """What went wrong with the store (``uris``: its URI), for an error line. A missing database driver: what to
    install. When the URI holds user information, or a codec failed (on a password), what went wrong in our words
    and the class of its cause, unless the store itself answered: a driver's message may quote pieces of a
    password (a host name cut from it, a character and its position). Else its first line, redacted."""
    causes = _causes(error)
    driver = next((cause for cause in causes if isinstance(cause, ImportError)), None)
    package = _DRIVER_PACKAGES.get(str(getattr(driver, "name", None) or "").split(".")[0])
    if package is not None:
        return f"its database driver cannot be imported ({driver}): pip install {package}"
    answered = isinstance(error, MlflowException) and len(causes) == 1  # a store's answer, not a client's failure
    if (any(map(userinfo, (*uris, *configured_uris()))) and not answered) or \
            any(isinstance(cause, UnicodeError) for cause in causes):
        said = " ".join(str(cause) for cause in causes).lower()
        words = next((words for markers, words in _CAUSE_WORDS if any(m in said for m in markers)),
                     "the store could not be used")
        innermost = type(causes[-1])
        where = "" if innermost.__module__ == "builtins" else innermost.__module__ + "."
        return f"{words} ({where}{innermost.__qualname__}; its message may quote the credentials, so it is not shown)"
    message = getattr(error, "message", None) or str(error)
    first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    # Redacted before it is cut: a cut through a password would leave its start unrecognised.
    text = redact_uri(first, *uris)
    text = text if len(text) <= 300 else text[:300] + "..."
    if "error code 401" in text or "error code 403" in text:
        # MLflow's message says only that we are not authenticated, and points at its website.
        text += " (set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD for this server)"
    return text


def _causes(error: BaseException) -> list[BaseException]:
    """``error`` and the errors it was raised from or while handling, outermost first."""
    causes: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in causes):
        causes.append(current)
        current = current.__cause__ or current.__context__
    return causes


# The package that brings each database driver SQLAlchemy imports, by the driver's module.
_DRIVER_PACKAGES = {
    "psycopg2": "psycopg2-binary (edps-mlflow's extra postgres: pip install -e '.[postgres]')",
    "psycopg": "'psycopg[binary]', or write postgresql+psycopg2:// and pip install psycopg2-binary",
    "MySQLdb": "mysqlclient, or write mysql+pymysql:// and pip install PyMySQL", "pymysql": "PyMySQL",
    "pyodbc": "pyodbc (and Microsoft's ODBC driver for SQL Server)"}
# What went wrong, in our words, by what the errors say (checked in this order).
_CAUSE_WORDS = (
    (("codec can't",), ("the user name or password holds a character the client cannot send (HTTP basic "
                        "authentication sends latin-1 characters only)")),
    (("password authentication failed", "access denied for user", "login failed", "error code 401"),
     "the store refused the user name or password"),
    (("error code 403",), "the store refused this user access (error code 403)"),
    (("could not translate host name", "name or service not known", "nodename nor servname", "name resolution",
      "getaddrinfo failed", "failed to resolve"), "its host name does not resolve"),
    (("connection refused",), "its host and port refuse connections"),
    (("does not exist", "unknown database"), "the database or user named in the URI does not exist"),
    (("timed out", "timeout expired"), "it did not answer in time"),
)


def uri_error(uri: str, error: BaseException) -> EdpsError:
    return EdpsError(describe_store_error(uri, error))


_STORE_LIBRARIES = ("mlflow", "requests", "urllib3", "sqlalchemy", "sqlite3", "psycopg2", "psycopg")


def store_error_line(error: BaseException, tracking_uri: str | None = None) -> str | None:
    """The one line for an error of the tracking store, its client libraries, or a full or read-only disk (the
    store's artifacts); None for others."""
    if type(error).__module__.split(".")[0] not in _STORE_LIBRARIES and not is_disk_error(error):
        return None
    return describe_store_error(tracking_uri or get_tracking_uri(), error)


@contextmanager
def store_errors(client: Any) -> Iterator[None]:
    """An MLflow error inside the block becomes the one line the user sees."""
    try:
        yield
    except MlflowException as error:
        raise uri_error(str(client.tracking_uri), error) from None


class StoreTrouble(Enum):
    LOCKED = "locked"  # another process holds the write lock past the busy timeout
    READ_ONLY = "read-only"
    FULL = "full"  # the disk (or the quota) of the database or of an artifact


# Where each is written: sqlite's messages, the OS's (artifacts, journals), PostgreSQL's read-only server.
_TROUBLE_MARKERS = {
    StoreTrouble.LOCKED: ("database is locked", "database table is locked"),
    StoreTrouble.READ_ONLY: ("attempt to write a readonly database", "read-only file system",
                             "read-only transaction"),
    StoreTrouble.FULL: ("database or disk is full", "no space left on device", "disk quota exceeded"),
}
_TROUBLE_ERRNOS = {errno.ENOSPC: StoreTrouble.FULL, errno.EDQUOT: StoreTrouble.FULL,
                   errno.EROFS: StoreTrouble.READ_ONLY}


def is_disk_error(error: BaseException) -> bool:
    """An OSError of a full or read-only disk (an artifact, a journal that could not be written)."""
    return isinstance(error, OSError) and error.errno in _TROUBLE_ERRNOS


def store_trouble(error: BaseException) -> StoreTrouble | None:
    """Locked, read-only or full, when ``error`` (or an error it was raised from) says so: MLflow wraps
    SQLAlchemy's error, which wraps sqlite's, and SQLAlchemy's first line may be a hint about autoflush."""
    for cause in _causes(error):
        if isinstance(cause, OSError) and cause.errno in _TROUBLE_ERRNOS:
            return _TROUBLE_ERRNOS[cause.errno]
        text = str(cause).lower()
        for trouble, markers in _TROUBLE_MARKERS.items():
            if any(marker in text for marker in markers):
                return trouble
    return None


def trouble_line(uri: str, trouble: StoreTrouble, error: BaseException | None = None, waited: str = "") -> str:
    """The one line for a locked, read-only or full store: the cause, the store, and what to do."""
    store = redact_uri(str(uri))
    path = sqlite_path(str(uri))
    if isinstance(error, OSError):  # a file of the store: an artifact (its folder), a journal
        where = str(error.filename) if error.filename else "its files"
    else:
        where = str(path) if path is not None else "it"
    if trouble is StoreTrouble.LOCKED:
        holders = lock_holders(path.resolve()) if path is not None else []
        return (f"tracking store {store} is locked: {locks.describe_holders(holders)} holds its write lock and did "
                f"not release it {f'within {waited}' if waited else 'while this process waited and tried again'}; "
                f"{locks.what_to_do(holders)}, then run the same command again")
    if trouble is StoreTrouble.READ_ONLY:
        return (f"tracking store {store} is read-only: {where} cannot be written ({_cause(error, trouble)}); make "
                f"it writable (its folder too), or set MLFLOW_TRACKING_URI to a writable store, then run the same "
                "command again")
    return (f"tracking store {store}: no space left on the disk that holds {where} ({_cause(error, trouble)}); "
            "free space there (or raise the quota), then run the same command again")


def _cause(error: BaseException | None, trouble: StoreTrouble) -> str:
    """The words of the error that say it (sqlite's, or the OS's), else the trouble's name."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error).lower() if error is not None else ""
    return next((marker for marker in _TROUBLE_MARKERS[trouble] if marker in text), trouble.value)


# sqlite's locks are fcntl byte-range locks (os_unix.c): PENDING at 1 GiB, RESERVED after it, then 510 bytes
# that readers share and the EXCLUSIVE writer takes whole. A write lock there stops writers (and readers,
# while PENDING or EXCLUSIVE); a read lock there is a reader, which keeps a writer from committing.
_PENDING_BYTE = 0x40000000
_LAST_LOCK_BYTE = _PENDING_BYTE + 2 + 510 - 1


def lock_holders(path: Path) -> list[int]:
    """The processes (other than this one) that hold sqlite's write lock on the database file ``path``, else
    those that hold its read lock; Linux only ([] elsewhere, or in WAL mode)."""
    return locks.lock_holders(path, _PENDING_BYTE, _LAST_LOCK_BYTE)
