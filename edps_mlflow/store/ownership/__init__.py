"""Who owns a study or sweep run (claim.py) and when its owner may write (lease.py)."""
