"""Analysis of steps-to-result measurements (regime fits, tables, figures).

Reads the tracking store into pandas DataFrames and never trains. The loaders, fits and the
``edps-analyze`` command are built on top of this package in a later step; today it only exists so
that the package layout is stable.
"""
