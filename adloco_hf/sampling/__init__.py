"""Which samples each worker trains on: resizable batch samplers over map-style data and streams, re-splits."""
