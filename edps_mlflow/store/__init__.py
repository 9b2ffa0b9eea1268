"""The tracking store: the one part of training that talks to MLflow (and imports no torch).

    client.py     a client that survives blips; open_store and connect; paged searches; batched writes
    trouble.py    a store error as one line: locked (by whom), read-only, full
    sqlite.py     a sqlite store built safely and checked before use; plugin.py hands that to MLflow
    logs.py       MLflow's log records to the command's log file
    index.py      the study index: every study run of an experiment without a search of its trial runs
    read/         what commands read: a study's trials, study and sweep runs, status rows, doctor's facts
    write/        what they write: experiments, index entries, study and trial runs, sweep runs
    ownership/    who owns a study or sweep run: leases, heartbeats, the claim

This file imports nothing: MLflow loads plugin.py while it imports itself.
"""
