"""Shared ground below every other layer: the GPU request, partition keys, device memory, the one atomic JSON
writer, a log file's tail. No Dagster, nothing of the package above it."""
