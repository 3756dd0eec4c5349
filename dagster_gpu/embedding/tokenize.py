"""Tokenization for the encoder: the model's Rust tokenizer, one private copy per thread, no padding.

``SentenceTransformer.preprocess`` goes through ``transformers``' Python tokenizer wrapper, which sets
truncation and padding *state* on the shared Rust tokenizer on every call (so two threads cannot share
it) and spends most of its time building Python lists. Here each thread encodes with its own copy of
the ``tokenizers.Tokenizer`` (``encode_batch_fast`` releases the GIL), truncated to the model's
``max_seq_length`` and unpadded, so the caller knows every text's exact token count before it forms
batches: sorting by *token* count (not characters, as ``encode`` does) gives batches with little padding,
and ``Encoding.overflowing`` says exactly which texts were truncated.

``FastTokenizer.for_model`` checks on probe texts that padding these encodings gives exactly the tensors
``SentenceTransformer.preprocess`` gives (ids, attention mask, token types); for a model where it does
not (another input module, a slow tokenizer, left padding, token types other than 0) it returns None and
the encoder uses ``preprocess`` itself.
"""

from __future__ import annotations

import copy
import functools
import itertools
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

#: Probe texts: empty-ish, whitespace at the ends, accents and CJK, an emoji, and two longer than any
#: usual max_seq_length (words and characters) so truncation is compared too.
PROBE_TEXTS = (
    "Hello world.",
    "  leading and trailing whitespace\n\t ",
    "Café, naïve, 日本語のテキスト. 🙂 Ünïcödé",
    "x",
    " ".join(["word"] * 600),
    "supercalifragilistic" * 200,
    "Two lines\nof text with\ttabs.",
)

_TENSOR_KEYS = {"input_ids", "attention_mask", "token_type_ids"}


@dataclass
class Tokenized:
    """Token ids of some texts, unpadded, in one flat array (no Python list per text: padding a model
    batch is a few numpy operations, not a loop holding the GIL while the device waits for its launches).

    Attributes:
        flat: every text's ids (special tokens included, truncated to max_seq_length), concatenated,
            int64 [lengths.sum()].
        lengths: tokens per text after truncation, int64 [n].
        truncated: True where the text had more tokens than max_seq_length, bool [n].
    """

    flat: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray

    def __len__(self) -> int:
        return len(self.lengths)

    @functools.cached_property
    def starts(self) -> np.ndarray:
        """Where each text's ids begin in ``flat``, int64 [n]."""
        return np.cumsum(self.lengths) - self.lengths

    def take(self, idx: np.ndarray) -> "Tokenized":
        """The texts at positions ``idx`` (int [k]), in that order."""
        lengths = self.lengths[idx]
        # position of every id of the selected texts in ``flat``: each text's start, repeated per token,
        # plus the token's offset within its text
        within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return Tokenized(self.flat[np.repeat(self.starts[idx], lengths) + within], lengths, self.truncated[idx])

    @staticmethod
    def from_encodings(encs: Sequence[Any]) -> "Tokenized":
        """From ``tokenizers.Encoding`` objects (truncated, unpadded): one pass over them for each array."""
        lengths = np.fromiter((len(e) for e in encs), dtype=np.int64, count=len(encs))
        flat = np.fromiter(itertools.chain.from_iterable(e.ids for e in encs), dtype=np.int64, count=int(lengths.sum()))
        truncated = np.fromiter((bool(e.overflowing) for e in encs), dtype=bool, count=len(encs))
        return Tokenized(flat, lengths, truncated)

    @staticmethod
    def concat(parts: Sequence["Tokenized"]) -> "Tokenized":
        if not parts:
            return Tokenized(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool))
        return Tokenized(*(np.concatenate([getattr(p, k) for p in parts]) for k in ("flat", "lengths", "truncated")))


class FastTokenizer:
    """Thread-safe unpadded tokenization with per-thread copies of a Rust tokenizer.

    Build it with ``for_model(st)``. ``encode(texts)`` may be called from any number of threads.
    ``pad(tokenized)`` builds the model's input tensors for one batch (right padding, int64).
    """

    def __init__(self, template, max_length: int, pad_id: int, keys: tuple[str, ...], extras: dict[str, Any]):
        self._template = template
        self.max_length = max_length
        self.pad_id = pad_id
        self.keys = keys
        self.extras = extras
        self._local = threading.local()

    @classmethod
    def for_model(cls, st) -> "FastTokenizer | None":
        """A FastTokenizer equivalent to ``st.preprocess`` for plain texts, or None (see the module docstring)."""
        try:
            hf = st.tokenizer
            backend = getattr(hf, "backend_tokenizer", None)
            if backend is None or getattr(hf, "padding_side", "right") != "right":
                return None
            max_length = int(st.max_seq_length)
            template = copy.deepcopy(backend)
            template.no_padding()
            trunc = backend.truncation or {}
            template.enable_truncation(max_length, strategy=trunc.get("strategy", "longest_first"),
                                       direction=trunc.get("direction", "right"))
            pad_id = hf.pad_token_id if hf.pad_token_id is not None else 0
            probe = (getattr(st, "preprocess", None) or st.tokenize)(list(PROBE_TEXTS))
        except Exception:
            return None
        tensor_keys = {k for k, v in probe.items() if hasattr(v, "shape")}
        if not tensor_keys <= _TENSOR_KEYS or not {"input_ids", "attention_mask"} <= tensor_keys:
            return None
        keys = tuple(k for k in ("input_ids", "attention_mask", "token_type_ids") if k in tensor_keys)
        extras = {k: v for k, v in probe.items() if k not in tensor_keys}
        fast = cls(template, max_length, int(pad_id), keys, extras)
        try:
            tok = fast.encode(list(PROBE_TEXTS))
            mine = fast.pad(tok)
        except Exception:
            return None
        for k in keys:
            theirs = probe[k].cpu().numpy()
            if theirs.shape != mine[k].shape or not np.array_equal(theirs, mine[k]):
                return None
        return fast

    def _tokenizer(self):
        tok = getattr(self._local, "tok", None)
        if tok is None:
            tok = self._local.tok = copy.deepcopy(self._template)
        return tok

    def encode(self, texts: Sequence[str]) -> Tokenized:
        """Unpadded ids of ``texts`` (this thread's tokenizer copy; the GIL is released while encoding)."""
        tok = self._tokenizer()
        fn = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
        return Tokenized.from_encodings(fn(list(texts)))

    def pad(self, tok: Tokenized) -> dict[str, np.ndarray]:
        """int64 arrays [len(tok), max(tok.lengths)] for the model's input keys (right padding, token type 0)."""
        width = int(tok.lengths.max()) if len(tok) else 0
        mask = np.arange(width) < tok.lengths[:, None]
        input_ids = np.full(mask.shape, self.pad_id, dtype=np.int64)
        input_ids[mask] = tok.flat  # a boolean mask fills row by row: the order of ``flat``
        out = {"input_ids": input_ids, "attention_mask": mask.astype(np.int64)}
        if "token_type_ids" in self.keys:
            out["token_type_ids"] = np.zeros(mask.shape, dtype=np.int64)
        return out
