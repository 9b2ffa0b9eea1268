"""Datasets as tensors: loaders (catalog.py names them), the seeded validation split (splits.py) and the data's
fingerprint. Nothing is imported here: a process that only plans does without torch."""
