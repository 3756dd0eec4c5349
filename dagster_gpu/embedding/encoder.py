"""Sentence embeddings with tokenization overlapped with the model (ours, replacing ``SentenceTransformer.encode``).

``SentenceTransformer.encode`` tokenizes a batch, runs the model, copies the result to the host, then
tokenizes the next batch: on a fast GPU the device waits for the CPU most of the time (measured on an
H200 with all-MiniLM-L6-v2: 30 % utilization, see bench/RESULTS.md). Here one tokenizer thread prepares
batch k+1 (HF fast tokenizers release the GIL) while the calling thread runs batch k on the device, and
results stay on the device until the whole call's batches are done (one host copy per call).

The steps per batch are ``SentenceTransformer``'s own for default arguments (``preprocess``/``tokenize``,
a copy to the device, ``model(features)["sentence_embedding"]``, L2 normalisation), on inputs sorted by
length as ``encode`` sorts them, so vectors agree with ``encode`` (cosine 1.0 up to float rounding).
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np


class OverlappedEncoder:
    """Encode with a tokenizer thread running ``prefetch`` batches ahead of the device.

    Args:
        st: a loaded ``SentenceTransformer``; its tokenizer must not be used by other threads meanwhile.
        batch_size: texts per forward pass.
        normalize: L2-normalise the vectors.
        prefetch: tokenized batches kept ready (>= 1).
    """

    def __init__(self, st, batch_size: int, normalize: bool = True, prefetch: int = 2):
        if batch_size < 1 or prefetch < 1:
            raise ValueError(f"batch_size and prefetch must be >= 1, got {batch_size}, {prefetch}")
        self.st = st
        self.batch_size = batch_size
        self.normalize = normalize
        self.prefetch = prefetch
        self._prep = getattr(st, "preprocess", None) or st.tokenize
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dagster-gpu-tokenize")
        self._pin = str(st.device).startswith("cuda")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _prepare(self, texts: list[str]):
        import torch

        features = self._prep(texts)
        if self._pin:
            features = {k: (v.pin_memory() if isinstance(v, torch.Tensor) else v) for k, v in features.items()}
        return features

    def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(vectors float32 [n, dim], tokens per text after truncation int64 [n]) in the order of ``texts``."""
        import torch

        n = len(texts)
        if n == 0:
            dim = self.st.get_embedding_dimension() if hasattr(self.st, "get_embedding_dimension") else self.st.get_sentence_embedding_dimension()
            return np.zeros((0, dim), np.float32), np.zeros(0, np.int64)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        ordered = [texts[i] for i in order]
        chunks = [ordered[i : i + self.batch_size] for i in range(0, n, self.batch_size)]
        pending = deque(self._pool.submit(self._prepare, c) for c in chunks[: self.prefetch])
        nxt = len(pending)
        vectors, lengths = [], []
        device = self.st.device
        with torch.inference_mode():
            for _ in chunks:
                features = pending.popleft().result()
                if nxt < len(chunks):
                    pending.append(self._pool.submit(self._prepare, chunks[nxt]))
                    nxt += 1
                lengths.append(features["attention_mask"].sum(dim=1))
                features = {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in features.items()}
                emb = self.st(features)["sentence_embedding"]
                if self.normalize:
                    emb = torch.nn.functional.normalize(emb, p=2, dim=1)
                vectors.append(emb)
            out = torch.cat(vectors).float().cpu().numpy()
        tokens = torch.cat(lengths).numpy().astype(np.int64)
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = np.arange(n)
        return out[inverse], tokens[inverse]
