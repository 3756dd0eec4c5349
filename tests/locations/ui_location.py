"""Code location for the browser test: the embedding asset over $DAGSTER_GPU_UI_CORPUS (never executed there),
downstream of its corpus as an external asset (``corpus_source``)."""

import os

import dagster as dg

from dagster_gpu import CorpusSource, TextFormat, corpus_source, embedding_asset, gpu_executor

corpus = CorpusSource(url=os.environ["DAGSTER_GPU_UI_CORPUS"], text_format=TextFormat(format="text", record_separator_line="%"))
ui_corpus, ui_embeddings = corpus_source(
    embedding_asset(name="ui_embeddings", corpus=corpus, output_url=os.environ["DAGSTER_GPU_UI_OUTPUT"], device="cpu"), corpus)

defs = dg.Definitions(assets=[ui_corpus, ui_embeddings], executor=gpu_executor)
