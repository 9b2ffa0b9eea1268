"""What commands read from the store; each module serves one kind of reader (see the package)."""
