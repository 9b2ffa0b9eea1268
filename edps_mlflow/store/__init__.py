"""The tracking store: the one part of training that talks to MLflow (and imports no torch). From the bottom up:

    trouble.py    a store error as one line: locked (by whom), read-only, full
    sqlite.py     a sqlite store built safely and checked before use; plugin.py hands that to MLflow
    index.py      the study index: every study run of an experiment without a search of its trial runs
    client.py     a client that survives blips; open_store and connect; paged searches; batched writes
    read/         what commands read: a study's trials, study and sweep runs, status rows, doctor's facts
    experiment.py an experiment, made with its study index; the index's entries; doctor's marks
    ownership/    who owns a study or sweep run: leases, heartbeats, the claim
    write/        what a study and a sweep leave: the study run and its trial runs, the sweep run

This file imports nothing: MLflow loads plugin.py while it imports itself.
"""
