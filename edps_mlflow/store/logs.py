"""MLflow's, alembic's and SQLAlchemy's log records to the command's log file, not the terminal: MLflow logs a
traceback at every failed store call (dozens for one locked store); the command says one line, naming the file.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from edps_mlflow.process_settings import library_log_file

# MLflow gives these handlers of its own on stderr when imported (mlflow.utils.logging_utils); SQLAlchemy's
# pool and dialects log under "sqlalchemy".
_LIBRARY_LOGGERS = ("mlflow", "alembic", "sqlalchemy", "sqlalchemy.engine", "huey")
_routed: dict[str, tuple[list[logging.Handler], bool]] = {}  # each routed logger's handlers before


class _LogFile(logging.FileHandler):
    """The command's log file, made at the first record; a failure to write it is not printed on the terminal."""

    def _open(self):  # noqa: ANN202 - logging's own signature
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()

    def handleError(self, record: logging.LogRecord) -> None:
        pass


def route_library_logs() -> None:
    """The libraries' records to the command's log file. Nothing changes outside a command (no
    ``EDPS_LOG_FILE``: a library caller, a test) or when the file is already in place."""
    path = library_log_file()
    if path is None:
        return
    if any(isinstance(h, _LogFile) and h.baseFilename == str(path.absolute())
           for h in logging.getLogger(_LIBRARY_LOGGERS[0]).handlers):
        return
    handler = _LogFile(path, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
    for name in _LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        _routed.setdefault(name, (logger.handlers, logger.propagate))
        logger.handlers = [handler]
        logger.propagate = False


def restore_library_logs() -> None:
    """Undo :func:`route_library_logs` (a command that ran inside another program, or a test, returns)."""
    for name, (handlers, propagate) in _routed.items():
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if isinstance(handler, _LogFile):
                handler.close()
        logger.handlers, logger.propagate = handlers, propagate
    _routed.clear()


@contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """Only warnings and errors from these loggers inside the block."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
