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

A prompt (``for_model(st, prompt)``) is prepended to every text before the Rust tokenizer, as
``SentenceTransformer.preprocess(texts, prompt=...)`` does (``Transformer.preprocess`` ->
``prepend_prompt_to_texts`` in sentence-transformers 6.2, ``sentence_transformers/base/modules/transformer.py``),
and the probe check compares against ``preprocess(PROBE_TEXTS, prompt=prompt)``; its ``prompt_length``
(what a Pooling with ``include_prompt=False`` leaves out) is kept in ``extras`` and handed to the model with
every batch, as ``encode`` does.

``Layout`` says which record and which characters each row came from and how many of each record's own
tokens reached the model (``encode_records``; ``chunking.cut_windows`` builds the chunked layout).
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
class Layout:
    """Where each row of a read batch came from, and how much of each record reached the model.

    Attributes (rows m, records n):
        record_index: int64 [m], index of the row's record, non-decreasing.
        chunk_index: int64 [m], 0, 1, ... within its record.
        char_start, char_end: int64 [m], the row's characters in its record's text (prompt excluded), [start, end).
        record_tokens: int64 [n], tokens of the record's text alone (no prompt, no special tokens, untruncated).
        covered_tokens: int64 [n], how many of those reached the model in at least one row.
    """

    record_index: np.ndarray
    chunk_index: np.ndarray
    char_start: np.ndarray
    char_end: np.ndarray
    record_tokens: np.ndarray
    covered_tokens: np.ndarray

    @staticmethod
    def concat(parts: Sequence["Layout"]) -> "Layout":
        """The layouts of consecutive slices of one read batch (record indices shifted to the whole batch)."""
        if not parts:
            z = np.zeros(0, np.int64)
            return Layout(z, z, z, z, z, z)
        shifted, base = [], 0
        for p in parts:
            shifted.append(p.record_index + base)
            base += len(p.record_tokens)
        cat = lambda k: np.concatenate([getattr(p, k) for p in parts])  # noqa: E731
        return Layout(np.concatenate(shifted), cat("chunk_index"), cat("char_start"), cat("char_end"),
                      cat("record_tokens"), cat("covered_tokens"))


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

    def __init__(self, template, max_length: int, pad_id: int, keys: tuple[str, ...], extras: dict[str, Any],
                 prompt: str = ""):
        self._template = template
        self.max_length = max_length
        self.pad_id = pad_id
        self.keys = keys
        self.extras = extras
        self.prompt = prompt
        self._local = threading.local()
        # The whole-text tokenizer: no truncation, no special tokens (record token counts, offsets, windows).
        self._whole_template = copy.deepcopy(template)
        self._whole_template.no_truncation()
        #: Special-token ids before / after a sequence (None: the post-processor does more than frame it,
        #: so windows of a record's ids cannot be framed; chunking refuses such a model).
        self.frame = _special_frame(self._whole_template)
        self.prompt_ids = np.asarray(self._whole_template.encode(prompt, add_special_tokens=False).ids if prompt else [],
                                     dtype=np.int64)
        #: Tokens of a row that are not the record's own: the special tokens and the prompt's.
        self.overhead = len(self._whole_template.encode(prompt, add_special_tokens=True).ids)

    @property
    def prompt_length(self) -> int | None:
        """``prompt_length`` as sentence-transformers hands it to the Pooling (None without a prompt)."""
        v = self.extras.get("prompt_length")
        return None if v is None else int(v)

    @classmethod
    def for_model(cls, st, prompt: str = "") -> "FastTokenizer | None":
        """A FastTokenizer equivalent to ``st.preprocess(texts, prompt=prompt)`` for plain texts, or None
        (see the module docstring)."""
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
            if prompt:
                probe = st.preprocess(list(PROBE_TEXTS), prompt=prompt)
            else:
                probe = (getattr(st, "preprocess", None) or st.tokenize)(list(PROBE_TEXTS))
        except Exception:
            return None
        tensor_keys = {k for k, v in probe.items() if hasattr(v, "shape")}
        if not tensor_keys <= _TENSOR_KEYS or not {"input_ids", "attention_mask"} <= tensor_keys:
            return None
        keys = tuple(k for k in ("input_ids", "attention_mask", "token_type_ids") if k in tensor_keys)
        extras = {k: v for k, v in probe.items() if k not in tensor_keys}
        try:
            fast = cls(template, max_length, int(pad_id), keys, extras, prompt)
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

    def whole_tokenizer(self):
        """This thread's copy of the tokenizer without truncation (``encode(text, add_special_tokens=False)``
        gives a record's own tokens with character offsets)."""
        tok = getattr(self._local, "whole", None)
        if tok is None:
            tok = self._local.whole = copy.deepcopy(self._whole_template)
        return tok

    def encode(self, texts: Sequence[str]) -> Tokenized:
        """Unpadded ids of the prompt + each of ``texts``, truncated to ``max_length`` (this thread's
        tokenizer copy; the GIL is released while encoding)."""
        tok = self._tokenizer()
        fn = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
        p = self.prompt
        return Tokenized.from_encodings(fn([p + t for t in texts] if p else list(texts)))

    def encode_records(self, texts: Sequence[str]) -> tuple[Tokenized, Layout]:
        """``encode(texts)`` and its layout: one row per text; a truncated text is tokenized once more,
        whole and with offsets, for its exact token count and where the truncation cut it (``char_end``)."""
        tok = self.encode(texts)
        n = len(texts)
        covered = np.maximum(tok.lengths - self.overhead, 0)
        record_tokens = covered.copy()
        char_end = np.fromiter((len(t) for t in texts), dtype=np.int64, count=n)
        cut = np.flatnonzero(tok.truncated)
        if len(cut):
            encs = self.whole_tokenizer().encode_batch([texts[i] for i in cut], add_special_tokens=False)
            for i, e in zip(cut, encs):
                record_tokens[i] = len(e.ids)
                covered[i] = min(int(covered[i]), len(e.ids))
                char_end[i] = e.offsets[covered[i] - 1][1] if covered[i] else 0
        idx = np.arange(n, dtype=np.int64)
        return tok, Layout(idx, np.zeros(n, np.int64), np.zeros(n, np.int64), char_end, record_tokens, covered)

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


def _special_frame(tok) -> tuple[np.ndarray, np.ndarray] | None:
    """The special-token ids the tokenizer's post-processor puts before and after a single sequence
    (``[CLS]`` / ``[SEP]`` for BERT's TemplateProcessing, ``<s>`` / ``</s>`` for RoBERTa's), found by
    post-processing a known encoding (``tokenizers.Tokenizer.post_process``) and locating its ids.

    None when the post-processor does more than frame the sequence with token type 0.
    """
    content = tok.encode("hello world", add_special_tokens=False)
    ids = list(content.ids)
    framed = tok.post_process(content)
    out = list(framed.ids)
    for i in range(len(out) - len(ids) + 1):
        if out[i : i + len(ids)] == ids:
            if any(framed.type_ids):
                break
            return np.asarray(out[:i], np.int64), np.asarray(out[i + len(ids):], np.int64)
    return None
