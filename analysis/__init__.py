"""Analysis of steps-to-result measurements: regime fits, tables, figures and reports, from the tracking store
(``load.py``; ``publish.py`` writes an analysis run) or a CSV, as pandas DataFrames; it never trains.
Command line: ``edps-analyze`` (``analysis/cli.py``); from Python (a notebook): ``from analysis import api``.
"""
