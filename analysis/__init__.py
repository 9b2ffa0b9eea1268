"""Analysis of steps-to-result measurements: regime fits, tables, figures and reports.

Reads the tracking store (``load.py``, the only MLflow reader here) or a CSV into pandas
DataFrames and never trains. Command line: ``edps-analyze`` (``analysis/cli.py``).
"""
