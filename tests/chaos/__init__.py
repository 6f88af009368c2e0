"""The chaos soak: worker processes, producers and a server under random faults."""
