"""What a study and a sweep leave in the store: their runs, written only while this process owns them."""
