"""A store that did not exist is created, in an existing folder, with one line saying where (a typo in the URI would
otherwise train into a store nobody looks at; a typo in a folder is refused: test_store_paths.py); an existing store
is opened silently."""

from __future__ import annotations

from edps_mlflow.store.client import open_store


def test_a_new_store_is_announced_once(tmp_path, capsys):
    path = tmp_path / "mlflow.db"
    open_store(f"sqlite:///{path}")
    first = capsys.readouterr().out.strip().splitlines()
    assert first == [f"created a new tracking store at {path.resolve()} (none was there; if you expected one, "
                     "check MLFLOW_TRACKING_URI)"]
    assert path.is_file()
    open_store(f"sqlite:///{path}")
    assert capsys.readouterr().out == ""
