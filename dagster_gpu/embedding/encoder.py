"""Sentence embeddings at the device's speed (ours, replacing ``SentenceTransformer.encode``).

``SentenceTransformer.encode`` tokenizes a batch on the calling thread, runs the model, copies the result
to the host, then tokenizes the next batch: on an H200 the device waited for one CPU thread 67 % of the
time (docs/benchmarks.md). ``Encoder`` instead:

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

The per-batch model steps are ``SentenceTransformer.encode``'s own (sentence-transformers 6.2,
``SentenceTransformer._inference`` in ``sentence_transformers/sentence_transformer/model.py``):
``st(features)["sentence_embedding"]``, then ``truncate_embeddings`` to ``truncate_dim`` (the first N
dimensions), then L2 normalisation when ``normalize``; with features equal to
``st.preprocess(texts, prompt=prompt)``'s (prompt prepended to each text, ``prompt_length`` passed for
prompt-aware pooling; checked on probe texts when the encoder is built, otherwise it falls back to
``st.preprocess`` on one thread), so vectors agree with ``encode(texts, prompt=..., truncate_dim=...,
normalize_embeddings=...)`` up to float rounding (cosine >= 0.9999 in tests/test_encoder.py and
tests/test_prompts.py; padding a text differently changes its vector by float noise only).

With ``chunking`` (``chunking.TokenChunks``) each text is tokenized once, whole, and cut into windows of
its tokens, each window one output row (``Encoded.record_index`` / ``chunk_index`` / ``char_start`` /
``char_end`` say which); see ``chunking``.

With ``devices`` (several, e.g. every GPU of the unit: ``devices.unit_devices``) each device holds a replica
of the model (``devices.replicate``) driven by its own thread and CUDA stream, and a read batch's model batches
are handed out in order to whichever replica is free (``devices.DeviceReplicas``); each batch's vectors are
copied to the host on its replica's stream and put back in input order, so rows and vectors are one device's.
One device (or ``devices=None``) runs the single-device path above, without replica threads.

One encoder serves one caller at a time and can be reused across many partitions (its threads, tokenizer
copies, CUDA stream and reduced batch size carry over); ``close()`` it at the end of the worker.
"""

from __future__ import annotations

import copy
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import numpy as np

from dagster_gpu.embedding.chunking import TokenChunks, cut_windows
from dagster_gpu.embedding.cpus import CpuShare
from dagster_gpu.embedding.devices import DeviceReplicas, normalize_device, replicate
from dagster_gpu.embedding.tokenize import FastTokenizer, Layout, Tokenized
from dagster_gpu.embedding.truncation import count_truncated, record_token_counts

T = TypeVar("T")

#: Texts per tokenizer job (a read batch is cut into at most ``tokenizer_threads`` slices of at least this).
MIN_SLICE = 256

#: Dtypes ``Encoded.vectors`` may have.
OUTPUT_DTYPES = ("float32", "float16")


class EncoderOutOfMemory(RuntimeError):
    """CUDA ran out of memory on a batch of a single text: the model does not fit the device."""


def _oom_types() -> tuple[type, ...]:
    import torch

    types = [getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)]
    return tuple({t for t in types if t is not None})


@dataclass
class Encoded:
    """One read batch's result: rows m in input order (m = n texts without chunking, else the chunks,
    record by record).

    Attributes:
        vectors: [m, dim], the encoder's ``output_dtype`` (float32 or float16).
        tokens: int64 [m], tokens the model saw per row (prompt and special tokens included, after truncation).
        truncated_rows: texts longer than max_seq_length tokens (0 with chunking).
        record_index: int64 [m], index of the row's text in the read batch, non-decreasing.
        chunk_index: int64 [m], 0, 1, ... within its text.
        char_start, char_end: int64 [m], the row's characters of its text (prompt excluded), [start, end):
            without chunking 0 and len(text), or where truncation cut the text (from the tokenizer's offsets;
            len(text) on the ``preprocess`` path, which has no offsets).
        record_tokens: int64 [n], tokens of each text alone (no prompt, no special tokens, untruncated).
        covered_tokens: int64 [n], of those, how many reached the model in at least one row.
    """

    vectors: np.ndarray
    tokens: np.ndarray
    truncated_rows: int
    record_index: np.ndarray | None = None
    chunk_index: np.ndarray | None = None
    char_start: np.ndarray | None = None
    char_end: np.ndarray | None = None
    record_tokens: np.ndarray | None = None
    covered_tokens: np.ndarray | None = None

    @property
    def token_coverage(self) -> float:
        """covered_tokens.sum() / record_tokens.sum() (1.0 when both are 0)."""
        total = int(self.record_tokens.sum()) if self.record_tokens is not None else 0
        return float(self.covered_tokens.sum()) / total if total else 1.0


@dataclass
class _Plan:
    """A tokenized read batch cut into model batches (sorted by token count, longest first)."""

    n: int
    order: np.ndarray  # order[j] = input index of the j-th sorted text
    chunks: list[dict[str, Any]]  # host features per model batch (+ "_lengths" for the fast path)
    tokens: np.ndarray  # input order
    truncated: np.ndarray | None  # input order; None = count later (preprocess path)
    texts: Sequence[str]
    layout: Layout | None = None  # None = one row per text, counted later (preprocess path)


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
        batch_size: rows per forward pass at the start (>= 1); halves on CUDA out-of-memory.
        normalize: L2-normalise the vectors (after truncate_dim), as ``encode(normalize_embeddings=True)``.
        prompt: the prompt text put before every text (``prompts.resolve_prompt``); "" = none.
        truncate_dim: keep the first N dimensions (Matryoshka), as ``encode(truncate_dim=N)``; None = the
            model's own ``st.truncate_dim`` (usually None: all dimensions).
        output_dtype: "float32" | "float16", the dtype of ``Encoded.vectors``.
        chunking: None = one row per text, truncated at max_seq_length; a ``TokenChunks`` = windows.
        tokenizer_threads: None = ``default_tokenizer_threads``.
        lookahead: read batches tokenized ahead of the device (>= 1).
        cpu_share: torch thread control; None = a ``CpuShare`` of this process (closed with the encoder),
            False = leave torch's threads alone.
        devices: the devices to embed on (``["cuda:0", "cuda:1"]``; a device may repeat), ``st`` serving the
            first entry equal to its own device and a replica each of the others; None or ``st``'s own
            device alone = the single-device path. ``Encoder.devices`` lists them, ``device_batches`` counts
            the model batches each ran.

    Raises ValueError for sizes below 1, truncate_dim above the model's dimension, an unknown output_dtype,
    a malformed or empty ``devices``, or chunking sizes that leave no room after the prompt and special tokens (``TokenChunks.room``) or a
    model without a fast tokenizer.
    """

    def __init__(self, st, batch_size: int = 64, *, normalize: bool = True, prompt: str = "",
                 truncate_dim: int | None = None, output_dtype: str = "float32", chunking: TokenChunks | None = None,
                 tokenizer_threads: int | None = None, lookahead: int = 2, cpu_share: CpuShare | bool | None = None,
                 devices: Sequence[str] | None = None):
        import torch

        if batch_size < 1 or lookahead < 1:
            raise ValueError(f"batch_size and lookahead must be >= 1, got {batch_size}, {lookahead}")
        if tokenizer_threads is not None and tokenizer_threads < 1:
            raise ValueError(f"tokenizer_threads must be >= 1, got {tokenizer_threads}")
        if output_dtype not in OUTPUT_DTYPES:
            raise ValueError(f"output_dtype {output_dtype!r}: expected one of {OUTPUT_DTYPES}")
        if devices is not None:  # checked before any thread or CPU share exists
            devices = list(devices)
            if not devices:
                raise ValueError("devices: an empty list (give at least one device, or None for the model's own)")
            for d in devices:
                normalize_device(d)  # ValueError naming a malformed one
        getter = getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension
        model_truncate = getattr(st, "truncate_dim", None)
        st.truncate_dim = None  # the model's full dimension, then ours
        try:
            full_dim = int(getter())
        finally:
            st.truncate_dim = model_truncate
        truncate_dim = truncate_dim if truncate_dim is not None else model_truncate
        if truncate_dim is not None and not 1 <= int(truncate_dim) <= full_dim:
            raise ValueError(f"truncate_dim={truncate_dim}: must be between 1 and the model's dimension {full_dim}")
        self.truncate_dim = None if truncate_dim is None or int(truncate_dim) == full_dim else int(truncate_dim)
        self._dim = self.truncate_dim or full_dim
        self.output_dtype = output_dtype
        self.prompt = prompt or ""
        self.chunking = chunking
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
        self.fast = FastTokenizer.for_model(st, self.prompt)
        self.mode = "fast" if self.fast is not None else "preprocess"
        if chunking is not None:
            if self.fast is None:
                raise ValueError("chunking needs the model's fast (Rust) tokenizer: this model has none that "
                                 "matches st.preprocess")
            chunking.room(int(st.max_seq_length), self.fast.overhead)  # ValueError naming the sizes
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
        self._oom_lock = threading.Lock()
        self._replicas: DeviceReplicas | None = None
        self.devices = [str(self.device)]
        if devices is not None:
            self._spread_over(list(devices))

    def _spread_over(self, devices: list[str]) -> None:
        """Replicas of the model on ``devices`` and their threads (nothing when it is ``st``'s device alone)."""
        import torch

        current = self.device.index if self.device.index is not None else (
            torch.cuda.current_device() if self.device.type == "cuda" else 0)
        own = normalize_device(str(self.device), current)
        wanted = [normalize_device(d, current) for d in devices]
        if wanted == [own]:
            self.devices = wanted
            return
        replicas, used_own = [], False
        for d in wanted:
            dev = torch.device(d)
            model = self.st if (d == own and not used_own) else replicate(self.st, d)
            used_own = used_own or model is self.st
            stream = torch.cuda.Stream(device=dev) if dev.type == "cuda" else None
            replicas.append(_Replica(model, dev, stream))
        for dev in {r.device for r in replicas if r.device.type == "cuda"}:
            # the weights were copied on each device's default stream; torch's streams do not wait for it
            torch.cuda.synchronize(dev)
        self.cuda = any(r.device.type == "cuda" for r in replicas)  # pinned host batches
        self.devices = wanted
        self._replicas = DeviceReplicas(replicas, self._replica_batch, setup=_Replica.context,
                                        names=[f"{d}-{i}" for i, d in enumerate(wanted)])

    @property
    def device_batches(self) -> list[int]:
        """Model batches each of ``devices`` has run (one entry: the single-device path, not counted: [0])."""
        return list(self._replicas.items_done) if self._replicas is not None else [0]

    # -- life cycle -----------------------------------------------------------------------------------
    def close(self) -> None:
        if self._replicas is not None:
            self._replicas.close()
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
        """Output dimension: truncate_dim when set, else the model's."""
        return self._dim

    @property
    def prompt_length(self) -> int | None:
        """``prompt_length`` handed to the model's pooling (None without a prompt or on the preprocess path)."""
        return self.fast.prompt_length if self.fast is not None else None

    # -- public API -----------------------------------------------------------------------------------
    def encode(self, texts: Sequence[str]) -> Encoded:
        """Vectors, token counts, truncated count and layout of ``texts``, in their order."""
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
        parts = [self._pool.submit(self._tokenize, texts[i : i + step]) for i in range(0, n, step)]
        return self._assembler.submit(self._plan_fast, texts, parts, self.batch_size)

    def _tokenize(self, texts: list[str]) -> tuple[Tokenized, Layout]:
        if self.chunking is None:
            return self.fast.encode_records(texts)
        return cut_windows(self.fast, texts, self.chunking, self.max_seq_length)

    def _plan_fast(self, texts: list[str], parts: list[Future], batch_size: int) -> _Plan:
        import torch

        done = [p.result() for p in parts]
        tok = Tokenized.concat([d[0] for d in done])
        layout = Layout.concat([d[1] for d in done])
        order = np.argsort(-tok.lengths, kind="stable")
        chunks = []
        for a in range(0, len(tok), batch_size):
            part = tok.take(order[a : a + batch_size])
            feats: dict[str, Any] = {k: self._host(torch.from_numpy(v)) for k, v in self.fast.pad(part).items()}
            feats["_lengths"] = part.lengths
            chunks.append(feats)
        return _Plan(len(tok), order, chunks, tok.lengths, tok.truncated, texts, layout)

    def _plan_preprocess(self, texts: list[str], batch_size: int) -> _Plan:
        import torch

        order = np.argsort([-len(t) for t in texts], kind="stable")
        chunks, lengths = [], []
        for a in range(0, len(texts), batch_size):
            feats = self._preprocess_texts([texts[i] for i in order[a : a + batch_size]])
            feats = {k: (self._host(v) if isinstance(v, torch.Tensor) else v) for k, v in feats.items()}
            lengths.append(feats["attention_mask"].sum(dim=1).numpy())
            chunks.append(feats)
        tokens = np.zeros(len(texts), np.int64)
        if chunks:
            tokens[order] = np.concatenate(lengths)
        return _Plan(len(texts), order, chunks, tokens, None, texts)

    def _preprocess_texts(self, texts: list[str]) -> dict[str, Any]:
        if not self.prompt:
            return self._preprocess(texts)
        if getattr(self.st, "preprocess", None) is not None:
            return self.st.preprocess(texts, prompt=self.prompt)
        return self._preprocess([self.prompt + t for t in texts])  # older sentence-transformers: st.tokenize

    def _host(self, t):
        return t.pin_memory() if self.cuda else t

    # -- the device (calling thread) -------------------------------------------------------------------
    def _run(self, plan: _Plan) -> PendingEncoded:
        import torch

        dim = self.dim
        out_dtype = getattr(torch, self.output_dtype)
        if plan.n == 0:
            z = np.zeros(0, np.int64)
            n = len(plan.texts)
            zn = np.zeros(n, np.int64)
            empty = Encoded(np.zeros((0, dim), np.dtype(self.output_dtype)), z, 0, z, z, z, z, zn, zn)
            return PendingEncoded(lambda: empty)
        if self._replicas is not None:
            return self._run_spread(plan)
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
            vecs = sorted_vecs.index_select(0, inv).to(out_dtype)
            if self.cuda:
                host = torch.empty(vecs.shape, dtype=out_dtype, pin_memory=True)
                host.copy_(vecs, non_blocking=True)
                done = torch.cuda.Event()
                done.record(self._stream)
            else:
                host, done = vecs, None

        def finish() -> Encoded:
            if done is not None:
                done.synchronize()
            return self._encoded(plan, host.numpy())

        return PendingEncoded(finish)

    def _encoded(self, plan: _Plan, vectors: np.ndarray) -> Encoded:
        layout = plan.layout
        if layout is None:
            layout, truncated = self._count_preprocessed(plan)
        else:
            truncated = int(plan.truncated.sum())
        return Encoded(vectors, plan.tokens, truncated, layout.record_index, layout.chunk_index,
                       layout.char_start, layout.char_end, layout.record_tokens, layout.covered_tokens)

    def _run_spread(self, plan: _Plan) -> PendingEncoded:
        """The model batches of ``plan`` handed out to the replicas in order; the vectors back in input order."""
        self._apply_threads()
        job = self._replicas.map(plan.chunks)
        dtype = np.dtype(self.output_dtype)

        def finish() -> Encoded:
            out = np.empty((plan.n, self.dim), dtype)
            row = 0
            for host, done in job.wait():
                if done is not None:
                    done.synchronize()
                part = host.numpy()
                out[plan.order[row : row + len(part)]] = part  # sorted rows back to their input positions
                row += len(part)
            return self._encoded(plan, out)

        return PendingEncoded(finish)

    def _replica_batch(self, replica: "_Replica", feats: dict[str, Any]):
        """One model batch on one replica (its thread, its stream): (host tensor, CUDA event or None)."""
        import torch

        outs = self._forward(feats, replica)
        vecs = (torch.cat(outs) if len(outs) > 1 else outs[0]).to(getattr(torch, self.output_dtype))
        if replica.stream is None:
            return vecs, None
        host = torch.empty(vecs.shape, dtype=vecs.dtype, pin_memory=True)
        host.copy_(vecs, non_blocking=True)
        done = torch.cuda.Event()
        done.record(replica.stream)
        return host, done

    def _count_preprocessed(self, plan: _Plan) -> tuple[Layout, int]:
        """Layout and truncated count of a preprocess-path plan, with the counting tokenizer (no offsets:
        char_end is len(text))."""
        texts = plan.texts
        n = len(texts)
        p = self.prompt
        maybe = [i for i, k in enumerate(plan.tokens) if k >= self.max_seq_length]
        truncated = count_truncated(self._counting_tokenizer, [p + texts[i] for i in maybe],
                                    self.max_seq_length) if maybe else 0
        record_tokens = record_token_counts(self._counting_tokenizer, texts)
        overhead = record_token_counts(self._counting_tokenizer, [p], add_special_tokens=True)[0] if p else \
            record_token_counts(self._counting_tokenizer, [""], add_special_tokens=True)[0]
        covered = np.minimum(record_tokens, np.maximum(plan.tokens - overhead, 0))
        idx = np.arange(n, dtype=np.int64)
        char_end = np.fromiter((len(t) for t in texts), np.int64, count=n)
        return Layout(idx, np.zeros(n, np.int64), np.zeros(n, np.int64), char_end, record_tokens, covered), truncated

    def _forward(self, feats: dict[str, Any], replica: "_Replica | None" = None) -> list:
        """Sentence embeddings of one model batch (sorted order), split by the current batch size; on
        CUDA out-of-memory the batch size halves and the failed piece is retried in smaller pieces.
        ``replica``: the model copy and device to run on (None = ``st`` on ``device``)."""
        rows = len(feats["input_ids"])
        step = self.batch_size  # may shrink while the pieces run; the pieces are cut once
        if rows > step:
            out = []
            for a in range(0, rows, step):
                out.extend(self._forward(self._slice(feats, a, a + step), replica))
            return out
        try:
            return [self._model(feats, replica)]
        except self._oom as e:
            if rows <= 1:
                raise EncoderOutOfMemory(
                    f"CUDA out of memory embedding a single text of {int(feats['attention_mask'][0].sum())} tokens "
                    f"with {self.dtype} weights on {replica.device if replica else self.device}: the model does "
                    "not fit this device"
                ) from e
        # Out of memory (outside the except block, so the failed attempt's tensors are already released).
        self._release()
        with self._oom_lock:  # replicas share the batch size: the devices hold the same model
            self.oom_retries += 1
            self.batch_size = max(1, min(self.batch_size, rows // 2))
        return self._forward(feats, replica)

    def _release(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.empty_cache()

    def _model(self, feats: dict[str, Any], replica: "_Replica | None" = None):
        import torch

        st, device = (self.st, self.device) if replica is None else (replica.model, replica.device)
        batch = {k: v for k, v in self._extras.items()}
        for k, v in feats.items():
            if k == "_lengths":
                continue
            batch[k] = v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
        emb = st(batch)["sentence_embedding"]
        if self.truncate_dim is not None:  # sentence_transformers.util.truncate_embeddings: the first N dims
            emb = emb[..., : self.truncate_dim]
        if self.normalize:
            emb = torch.nn.functional.normalize(emb.float(), p=2, dim=1)
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


@dataclass
class _Replica:
    """One device's model copy and (on CUDA) the stream its batches and host copies run on."""

    model: Any
    device: Any  # torch.device
    stream: Any = None

    @staticmethod
    @contextmanager
    def context(replica: "_Replica"):
        """Entered once on the replica's thread: inference mode (thread-local), its device and stream."""
        import torch

        with torch.inference_mode():
            if replica.stream is None:
                yield
            else:
                with torch.cuda.device(replica.device), torch.cuda.stream(replica.stream):
                    yield
