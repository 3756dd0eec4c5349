"""A code location for the search tests: an embedding asset and its index under $DAGSTER_GPU_INDEX_TEST_DIR."""

import os
from pathlib import Path

import dagster as dg

from dagster_gpu import ComputeSpec, CorpusSource, TextFormat, embedding_asset, vector_index_asset

ROOT = Path(os.environ.get("DAGSTER_GPU_INDEX_TEST_DIR", "/tmp/dagster-gpu-index-test"))
emb = embedding_asset(name="emb", corpus=CorpusSource(url=str(ROOT / "corpus"), text_format=TextFormat()),
                      output=str(ROOT / "out"), compute=ComputeSpec(device="cpu"))
emb_index = vector_index_asset(emb, uri=str(ROOT / "lance"), ann_min_rows=10**9)
defs = dg.Definitions(assets=[emb, emb_index])
