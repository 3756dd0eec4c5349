"""Corpus partitions: listing files (local or s3://) and streaming their records."""

from dagster_gpu.corpus.listing import CorpusFile, CorpusSource
from dagster_gpu.corpus.readers import CorpusReadError, RecordBatch, TextFormat, read_batches

__all__ = ["CorpusFile", "CorpusReadError", "CorpusSource", "RecordBatch", "TextFormat", "read_batches"]
