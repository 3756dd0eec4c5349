"""Sentence embeddings at the device's speed (ours, replacing ``SentenceTransformer.encode``).

``SentenceTransformer.encode`` tokenizes a batch on the calling thread, runs the model, copies the result
to the host, then tokenizes the next batch: on an H200 the device waited for one CPU thread 67 % of the
time (bench/RESULTS.md). ``Encoder`` instead:

* tokenizes on ``tokenizer_threads`` threads, each with its own copy of the Rust tokenizer
  (``tokenize.FastTokenizer``), whole read batches ahead of the device (``lookahead`` of them), and pads
  each model batch on an assembler thread, into pinned memory on CUDA;
* sorts each read batch by **token** count before cutting it into model batches (``encode`` sorts by
  characters: on the fortunes corpus that pads 230 k tokens where token order pads 160 k for 151 k real
  ones at batch 64), and puts the vectors back in input order;
* keeps results on the device and copies each read batch to the host once, on its own CUDA stream,
  finished by whoever reads the result (the pipeline's writer thread), so the calling thread never waits;
* on CUDA out-of-memory halves the model batch and retries that batch (down to 1 text), and keeps the
  smaller size for the rest of the worker (``batch_size`` now, ``oom_retries`` so far);
* sets torch's intra-op threads to this worker's share of the CPUs it was given (``cpus.CpuShare``).

The per-batch model steps are ``SentenceTransformer``'s own (``st(features)["sentence_embedding"]``, then L2
normalisation), with features equal to ``st.preprocess``'s for the same texts (checked on probe texts when
the encoder is built; otherwise it falls back to ``st.preprocess`` on one thread), so vectors agree with
``encode`` up to float rounding (cosine >= 0.999 in tests/test_encoder.py; padding a text differently
changes its vector by float noise only).

One encoder serves one caller at a time and can be reused across many partitions (its threads, tokenizer
copies, CUDA stream and reduced batch size carry over); ``close()`` it at the end of the worker.
"""

from __future__ import annotations

import copy
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import numpy as np

from dagster_gpu.embedding.cpus import CpuShare
from dagster_gpu.embedding.tokenize import FastTokenizer, Tokenized
from dagster_gpu.embedding.truncation import count_truncated

T = TypeVar("T")

#: Texts per tokenizer job (a read batch is cut into at most ``tokenizer_threads`` slices of at least this).
MIN_SLICE = 256


class EncoderOutOfMemory(RuntimeError):
    """CUDA ran out of memory on a batch of a single text: the model does not fit the device."""


def _oom_types() -> tuple[type, ...]:
    import torch

    types = [getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)]
    return tuple({t for t in types if t is not None})


@dataclass
class Encoded:
    """One read batch's result, in input order.

    Attributes:
        vectors: float32 [n, dim].
        tokens: tokens per text after truncation, int64 [n].
        truncated_rows: texts longer than max_seq_length tokens.
    """

    vectors: np.ndarray
    tokens: np.ndarray
    truncated_rows: int


@dataclass
class _Plan:
    """A tokenized read batch cut into model batches (sorted by token count, longest first)."""

    n: int
    order: np.ndarray  # order[j] = input index of the j-th sorted text
    chunks: list[dict[str, Any]]  # host features per model batch (+ "_lengths" for the fast path)
    tokens: np.ndarray  # input order
    truncated: np.ndarray | None  # input order; None = count later (preprocess path)
    texts: Sequence[str]


class PendingEncoded:
    """A read batch whose vectors may still be on their way to the host; ``result()`` waits for them."""

    def __init__(self, finish: Callable[[], Encoded]):
        self._finish = finish
        self._result: Encoded | None = None

    def result(self) -> Encoded:
        if self._result is None:
            self._result = self._finish()
        return self._result


def default_tokenizer_threads(device: str, cpus: int) -> int:
    """Tokenizer threads: on CUDA all CPUs but the one that drives the device (at most 16); on CPU one
    (tokenizing is ~1 % of a CPU forward pass, the cores belong to torch)."""
    if str(device).startswith("cuda"):
        return max(1, min(16, cpus - 1))
    return 1


class Encoder:
    """Encode texts with ``st`` (a loaded ``SentenceTransformer``); see the module docstring.

    Args:
        st: the model; its tokenizer must not be used by other threads meanwhile (the preprocess path).
        batch_size: texts per forward pass at the start (>= 1); halves on CUDA out-of-memory.
        normalize: L2-normalise the vectors.
        tokenizer_threads: None = ``default_tokenizer_threads``.
        lookahead: read batches tokenized ahead of the device (>= 1).
        cpu_share: torch thread control; None = a ``CpuShare`` of this process (closed with the encoder),
            False = leave torch's threads alone.
    """

    def __init__(self, st, batch_size: int = 64, *, normalize: bool = True, tokenizer_threads: int | None = None,
                 lookahead: int = 2, cpu_share: CpuShare | bool | None = None):
        import torch

        if batch_size < 1 or lookahead < 1:
            raise ValueError(f"batch_size and lookahead must be >= 1, got {batch_size}, {lookahead}")
        if tokenizer_threads is not None and tokenizer_threads < 1:
            raise ValueError(f"tokenizer_threads must be >= 1, got {tokenizer_threads}")
        # Our threads give the parallelism; the Rust pool inside each call would oversubscribe the CPUs.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.st = st
        self.device = torch.device(st.device)
        self.cuda = self.device.type == "cuda"
        self.batch_size_initial = int(batch_size)
        self.batch_size = int(batch_size)
        self.oom_retries = 0
        self.normalize = normalize
        self.lookahead = lookahead
        self.dtype = str(next(st.parameters()).dtype).replace("torch.", "")
        self._owns_share = cpu_share is None
        self._share = CpuShare() if cpu_share is None else (cpu_share or None)
        self.torch_threads = torch.get_num_threads()
        self._apply_threads()
        cpus = self._share.allotment.cpus if self._share else (os.cpu_count() or 1)
        self.fast = FastTokenizer.for_model(st)
        self.mode = "fast" if self.fast is not None else "preprocess"
        if self.fast is None:
            tokenizer_threads = 1  # st.preprocess uses the model's one tokenizer
        self.tokenizer_threads = tokenizer_threads or default_tokenizer_threads(str(self.device), cpus)
        self._pool = ThreadPoolExecutor(self.tokenizer_threads, thread_name_prefix="dagster-gpu-tokenize")
        self._assembler = ThreadPoolExecutor(1, thread_name_prefix="dagster-gpu-assemble")
        self._counting_tokenizer = None
        if self.fast is None:  # exact truncation counts need a tokenizer of their own (the writer's thread)
            self._counting_tokenizer = copy.deepcopy(st.tokenizer)
        self.max_seq_length = int(st.max_seq_length)
        self._stream = torch.cuda.Stream(device=self.device) if self.cuda else None
        self._extras = self.fast.extras if self.fast else {}
        self._preprocess = getattr(st, "preprocess", None) or st.tokenize  # older sentence-transformers
        self._oom = _oom_types()

    # -- life cycle -----------------------------------------------------------------------------------
    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._assembler.shutdown(wait=True, cancel_futures=True)
        if self._share is not None and self._owns_share:
            self._share.close()

    def __enter__(self) -> "Encoder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _apply_threads(self) -> None:
        if self._share is None:
            return
        import torch

        n = self._share.threads()
        if n != torch.get_num_threads():
            torch.set_num_threads(n)
        self.torch_threads = n

    @property
    def dim(self) -> int:
        getter = getattr(self.st, "get_embedding_dimension", None) or self.st.get_sentence_embedding_dimension
        return int(getter())

    # -- public API -----------------------------------------------------------------------------------
    def encode(self, texts: Sequence[str]) -> Encoded:
        """Vectors, token counts and truncated count of ``texts``, in their order."""
        for _, pending in self.encode_stream([texts], texts=lambda t: t):
            return pending.result()
        raise AssertionError("unreachable")

    def encode_stream(self, items: Iterable[T], texts: Callable[[T], Sequence[str]] = lambda b: b.texts
                      ) -> Iterator[tuple[T, PendingEncoded]]:
        """``(item, PendingEncoded)`` per item of ``items`` (e.g. RecordBatch), in order.

        The next ``lookahead`` items are taken from ``items`` and tokenized while the current one is on
        the device. ``PendingEncoded.result()`` may be called from another thread (it waits for the host
        copy). An exception raised by ``items`` propagates here.
        """
        it = iter(items)
        ahead: deque[tuple[T, Future]] = deque()

        def take() -> bool:
            try:
                item = next(it)
            except StopIteration:
                return False
            ahead.append((item, self._submit(list(texts(item)))))
            return True

        for _ in range(self.lookahead):
            if not take():
                break
        while ahead:
            item, planned = ahead.popleft()
            plan = planned.result()
            pending = self._run(plan)
            take()
            yield item, pending

    # -- tokenization (pool threads) -------------------------------------------------------------------
    def _submit(self, texts: list[str]) -> Future:
        n = len(texts)
        if self.fast is None:
            return self._pool.submit(self._plan_preprocess, texts, self.batch_size)
        k = max(1, min(self.tokenizer_threads, -(-n // MIN_SLICE)))
        step = -(-n // k) if n else 1
        parts = [self._pool.submit(self.fast.encode, texts[i : i + step]) for i in range(0, n, step)]
        return self._assembler.submit(self._plan_fast, texts, parts, self.batch_size)

    def _plan_fast(self, texts: list[str], parts: list[Future], batch_size: int) -> _Plan:
        import torch

        tok = Tokenized.concat([p.result() for p in parts])
        order = np.argsort(-tok.lengths, kind="stable")
        chunks = []
        for a in range(0, len(texts), batch_size):
            part = tok.take(order[a : a + batch_size])
            feats: dict[str, Any] = {k: self._host(torch.from_numpy(v)) for k, v in self.fast.pad(part).items()}
            feats["_lengths"] = part.lengths
            chunks.append(feats)
        return _Plan(len(texts), order, chunks, tok.lengths, tok.truncated, texts)

    def _plan_preprocess(self, texts: list[str], batch_size: int) -> _Plan:
        import torch

        order = np.argsort([-len(t) for t in texts], kind="stable")
        chunks, lengths = [], []
        for a in range(0, len(texts), batch_size):
            feats = self._preprocess([texts[i] for i in order[a : a + batch_size]])
            feats = {k: (self._host(v) if isinstance(v, torch.Tensor) else v) for k, v in feats.items()}
            lengths.append(feats["attention_mask"].sum(dim=1).numpy())
            chunks.append(feats)
        tokens = np.zeros(len(texts), np.int64)
        if chunks:
            tokens[order] = np.concatenate(lengths)
        return _Plan(len(texts), order, chunks, tokens, None, texts)

    def _host(self, t):
        return t.pin_memory() if self.cuda else t

    # -- the device (calling thread) -------------------------------------------------------------------
    def _run(self, plan: _Plan) -> PendingEncoded:
        import torch

        dim = self.dim
        if plan.n == 0:
            empty = Encoded(np.zeros((0, dim), np.float32), np.zeros(0, np.int64), 0)
            return PendingEncoded(lambda: empty)
        outs = []
        ctx = torch.cuda.stream(self._stream) if self.cuda else nullcontext()
        with torch.inference_mode(), ctx:
            for feats in plan.chunks:
                self._apply_threads()  # re-counts the host's workers every CpuShare.recount_s at most
                outs.extend(self._forward(feats))
            sorted_vecs = torch.cat(outs) if len(outs) > 1 else outs[0]
            inverse = np.empty(plan.n, dtype=np.int64)
            inverse[plan.order] = np.arange(plan.n)
            inv = torch.from_numpy(inverse)
            if self.cuda:
                inv = inv.pin_memory().to(self.device, non_blocking=True)
            vecs = sorted_vecs.index_select(0, inv).float()
            if self.cuda:
                host = torch.empty(vecs.shape, dtype=torch.float32, pin_memory=True)
                host.copy_(vecs, non_blocking=True)
                done = torch.cuda.Event()
                done.record(self._stream)
            else:
                host, done = vecs, None

        def finish() -> Encoded:
            if done is not None:
                done.synchronize()
            if plan.truncated is not None:
                truncated = int(plan.truncated.sum())
            else:
                full = [t for t, k in zip(plan.texts, plan.tokens) if k >= self.max_seq_length]
                truncated = count_truncated(self._counting_tokenizer, full, self.max_seq_length) if full else 0
            return Encoded(host.numpy(), plan.tokens, truncated)

        return PendingEncoded(finish)

    def _forward(self, feats: dict[str, Any]) -> list:
        """Sentence embeddings of one model batch (sorted order), split by the current batch size; on
        CUDA out-of-memory the batch size halves and the failed piece is retried in smaller pieces."""
        rows = len(feats["input_ids"])
        step = self.batch_size  # may shrink while the pieces run; the pieces are cut once
        if rows > step:
            out = []
            for a in range(0, rows, step):
                out.extend(self._forward(self._slice(feats, a, a + step)))
            return out
        try:
            return [self._model(feats)]
        except self._oom as e:
            if rows <= 1:
                raise EncoderOutOfMemory(
                    f"CUDA out of memory embedding a single text of {int(feats['attention_mask'][0].sum())} tokens "
                    f"with {self.dtype} weights on {self.device}: the model does not fit this device"
                ) from e
        # Out of memory (outside the except block, so the failed attempt's tensors are already released).
        self._release()
        self.oom_retries += 1
        self.batch_size = max(1, min(self.batch_size, rows // 2))
        return self._forward(feats)

    def _release(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.empty_cache()

    def _model(self, feats: dict[str, Any]):
        import torch

        batch = {k: v for k, v in self._extras.items()}
        for k, v in feats.items():
            if k == "_lengths":
                continue
            batch[k] = v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v
        emb = self.st(batch)["sentence_embedding"]
        if self.normalize:
            emb = torch.nn.functional.normalize(emb, p=2, dim=1)
        return emb

    @staticmethod
    def _slice(feats: dict[str, Any], a: int, b: int) -> dict[str, Any]:
        """Rows a:b of a model batch; the fast path's (right-padded, lengths known) is also cut to its width."""
        import torch

        lengths = feats.get("_lengths")
        width = int(lengths[a:b].max()) if lengths is not None else None
        out: dict[str, Any] = {}
        for k, v in feats.items():
            if k == "_lengths":
                out[k] = v[a:b]
            elif isinstance(v, torch.Tensor) and v.dim() >= 1:
                out[k] = v[a:b, :width] if (width is not None and v.dim() == 2) else v[a:b]
            else:
                out[k] = v
        return out


#: The former name (issue 2), kept for callers that import it.
OverlappedEncoder = Encoder
