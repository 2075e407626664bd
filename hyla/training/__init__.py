"""Training utilities for hyla's embedded default model (data pipeline, training forward)."""
