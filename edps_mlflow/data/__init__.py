"""Datasets as tensors: loaders (digits, idx for MNIST, cifar, shakespeare; catalog.py names them), the seeded
validation split and normalisation (splits.py), and the data's fingerprint (fingerprint.py).

Nothing is imported here: splits.py loads torch, which a process that only plans (a sweep's parent, whose
fingerprint of the data is cached) does without.
"""
