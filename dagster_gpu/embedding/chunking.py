"""Long records cut into windows of the model's own tokens, each window one embedded row.

Each record is tokenized once, whole (no truncation, no special tokens, with character offsets and word ids),
by the model's Rust tokenizer (``tokenize.FastTokenizer.whole_tokenizer``). Its ids are cut into windows of at
most ``room = max_tokens - special tokens - prompt tokens`` ids; each window becomes
``prefix + prompt ids + window ids + suffix``, where prefix/suffix are the special tokens the tokenizer's
post-processor puts around one sequence (``tokenizers.Tokenizer.post_process``; ``[CLS]`` / ``[SEP]`` for
BERT), so a window is what the model sees for a normal encoding of the prompt + that text.

Windows start and end on word boundaries: a word is one of the pre-tokenizer's splits, as
``tokenizers.Encoding.word_ids`` numbers them (``PreTokenizedString::into_encoding`` gives every split its
index; huggingface/tokenizers, ``tokenizers/src/tokenizer/pre_tokenizer.rs``), so a window never opens on a
WordPiece ``##`` continuation nor ends before one. A window therefore ends at the last word end within its
room, possibly short of ``room``; consecutive windows share the whole words in the previous window's last
``overlap`` tokens (at most ``overlap`` tokens, none when its last word alone is longer). The one exception:
a single word longer than the room is cut inside it (``room`` tokens per window, the windows around it
snapped as usual). For a tokenizer that tokenizes each pre-tokenized word on its own (BERT's WordPiece behind
``BertPreTokenizer``: whitespace and punctuation splits), the text of a window, ``text[char_start:char_end]``,
re-tokenizes to exactly the window's ids, so ``SentenceTransformer.encode`` of that text gives the row's
vector.

``boundary`` "sentence" / "paragraph" prefers ending a window (other than a record's last) at the last
sentence / paragraph end inside the window's second half; "paragraph" falls back to a sentence end, then
to the last word end. A sentence ends after ``.``, ``!``, ``?`` or ``…`` (and any closing quotes or
brackets) followed by whitespace, after ``。！？``, and at a paragraph end (a line break, optional blanks,
another line break).

A window never spans two records. Character offsets come from the tokenizer's offsets (Python character
indices into the record's text, the prompt excluded): ``[start of the window's first token, end of its last)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dagster_gpu.embedding.tokenize import FastTokenizer, Layout, Tokenized

BOUNDARIES = ("token", "sentence", "paragraph")

_SENTENCE_END = re.compile(r"[.!?\u2026][\"'\u201d\u2019)\]]*(?=\s)|[\u3002\uff01\uff1f]")
_PARAGRAPH_END = re.compile(r"\n[^\S\n]*\n")


@dataclass(frozen=True)
class TokenChunks:
    """Cut each record into windows of the model's tokens (see the module docstring).

    Attributes:
        max_tokens: tokens per window, the prompt's and the special tokens included; None = the model's
            max_seq_length.
        overlap: at most this many tokens, in whole words, shared by consecutive windows of a record
            (< the window's room for the record's tokens).
        boundary: "token" | "sentence" | "paragraph": where a window prefers to end ("token": at the last word
            end that fits; windows always start and end on word boundaries, see the module docstring).

    Raises ValueError for overlap < 0, max_tokens < 1 or an unknown boundary; ``room`` raises it for sizes
    that leave no room.
    """

    max_tokens: int | None = None
    overlap: int = 0
    boundary: str = "token"

    def __post_init__(self):
        if self.max_tokens is not None and int(self.max_tokens) < 1:
            raise ValueError(f"TokenChunks.max_tokens must be >= 1 (or None), got {self.max_tokens}")
        if int(self.overlap) < 0:
            raise ValueError(f"TokenChunks.overlap must be >= 0, got {self.overlap}")
        if self.boundary not in BOUNDARIES:
            raise ValueError(f"TokenChunks.boundary {self.boundary!r}: expected one of {BOUNDARIES}")

    def describe(self) -> dict:
        """JSON-able fields, for the fingerprint and metadata; ``edges: "word"`` names the window rule (windows
        start and end on word boundaries), so outputs cut by another rule carry another fingerprint."""
        return {"max_tokens": None if self.max_tokens is None else int(self.max_tokens),
                "overlap": int(self.overlap), "boundary": self.boundary, "edges": "word"}

    def window(self, max_seq_length: int) -> int:
        """Tokens per window for a model of ``max_seq_length``; ValueError when max_tokens exceeds it."""
        w = int(max_seq_length if self.max_tokens is None else self.max_tokens)
        if w > max_seq_length:
            raise ValueError(f"TokenChunks.max_tokens={w} exceeds the model's max_seq_length={max_seq_length}")
        return w

    def room(self, max_seq_length: int, overhead: int) -> int:
        """Record tokens per window: the window less ``overhead`` (special + prompt tokens).

        Raises ValueError naming the sizes when nothing is left or ``overlap`` >= what is left.
        """
        w = self.window(max_seq_length)
        room = w - int(overhead)
        if room < 1:
            raise ValueError(f"TokenChunks.max_tokens={w} leaves no room for the record's tokens: the prompt and "
                             f"special tokens take {overhead}")
        if self.overlap >= room:
            raise ValueError(f"TokenChunks.overlap={self.overlap} must be below the {room} record tokens per window "
                             f"(max_tokens {w} less {overhead} prompt and special tokens)")
        return room


def boundary_ends(text: str, offsets: np.ndarray, boundary: str) -> tuple[np.ndarray, np.ndarray]:
    """Token positions after which a window may end: ``(sentence ends, paragraph ends)``, each int64 sorted,
    as window end indices (``k`` = the window ends after token ``k - 1``). ``offsets``: int64 [n, 2]."""
    n = len(offsets)
    empty = np.zeros(0, np.int64)
    if boundary == "token" or n == 0:
        return empty, empty
    ends = offsets[:, 1]
    # paragraph: the last token ending at or before the break's start
    starts = np.asarray([m.start() for m in _PARAGRAPH_END.finditer(text)], np.int64)
    para = np.searchsorted(ends, starts, side="right") if len(starts) else empty
    para = np.unique(para[para > 0])
    sent_chars = np.asarray([m.end() for m in _SENTENCE_END.finditer(text)], np.int64)
    sent = np.flatnonzero(np.isin(ends, sent_chars)) + 1 if len(sent_chars) else empty
    return np.union1d(sent, para).astype(np.int64), para.astype(np.int64)


def word_starts(word_ids: Sequence[int | None]) -> np.ndarray:
    """Token positions where a word begins (``Encoding.word_ids`` of one sequence, no special tokens), int64
    sorted, 0 first for a non-empty sequence; a token without a word id (None) counts as its own word."""
    n = len(word_ids)
    if n == 0:
        return np.zeros(0, np.int64)
    w = np.fromiter((-1 - i if x is None else x for i, x in enumerate(word_ids)), np.int64, count=n)
    return np.concatenate([[0], np.flatnonzero(w[1:] != w[:-1]) + 1]).astype(np.int64)


def windows(n: int, room: int, overlap: int, sentence_ends: np.ndarray | None = None,
            paragraph_ends: np.ndarray | None = None, starts: np.ndarray | None = None) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` token windows over ``n`` tokens, the last ending at ``n``; ``n == 0`` gives one
    empty window.

    ``starts``: sorted token positions where a word begins (``word_starts``; None = every token is a word).
    A window starts and ends at a word start (or ``n``) and is at most ``room`` long: it ends at the last word
    start within ``room`` (a word longer than ``room`` is the one case cut inside); a window other than the last
    ends instead at the last preferred end (paragraph ends first, then sentence ends; those at word starts) inside
    its second half when there is one. The next window starts at the first word start at or after
    ``end - overlap`` (so consecutive windows share at most ``overlap`` tokens, whole words) and after the
    previous start.
    """
    if n == 0:
        return [(0, 0)]
    cuts = np.arange(n + 1, dtype=np.int64) if starts is None else \
        np.union1d(np.asarray(starts, np.int64), np.array([0, n], np.int64))
    prefs = [np.intersect1d(p, cuts) for p in (paragraph_ends, sentence_ends) if p is not None and len(p)]
    out = []
    start = 0
    while True:
        limit = min(start + room, n)
        end = int(cuts[np.searchsorted(cuts, limit, side="right") - 1])
        if end <= start:  # one word longer than the room: cut inside it
            end = limit
        if end < n and prefs:
            lo = start + max(overlap + 1, room // 2)
            for p in prefs:
                k = int(np.searchsorted(p, limit, side="right")) - 1
                if k >= 0 and p[k] >= lo:
                    end = int(p[k])
                    break
        out.append((start, end))
        if end >= n:
            return out
        nxt = int(cuts[np.searchsorted(cuts, max(end - overlap, start + 1), side="left")])
        start = min(nxt, end)  # past ``end`` only inside an over-long word: continue where it was cut


def cut_windows(fast: FastTokenizer, texts: Sequence[str], chunks: TokenChunks,
                max_seq_length: int) -> tuple[Tokenized, Layout]:
    """Rows (model ids of every window, records in order) and their layout for ``texts``.

    Raises ValueError when the sizes leave no room (``TokenChunks.room``) or the tokenizer's post-processor
    is not a frame of special tokens (``FastTokenizer.frame`` None).
    """
    if fast.frame is None:
        raise ValueError("chunking: this tokenizer's post-processor does more than add special tokens around a "
                         "sequence; its windows cannot be built from the record's ids")
    room = chunks.room(max_seq_length, fast.overhead)
    prefix, suffix = fast.frame
    head = np.concatenate([prefix, fast.prompt_ids]).astype(np.int64)
    encs = fast.whole_tokenizer().encode_batch(list(texts), add_special_tokens=False)
    pieces: list[np.ndarray] = []
    rec, chunk, cstart, cend = [], [], [], []
    record_tokens = np.zeros(len(texts), np.int64)
    for r, (text, e) in enumerate(zip(texts, encs)):
        ids = np.asarray(e.ids, np.int64)
        offsets = np.asarray(e.offsets, np.int64).reshape(-1, 2)
        record_tokens[r] = len(ids)
        sent, para = boundary_ends(text, offsets, chunks.boundary)
        if chunks.boundary != "paragraph":
            para = None
        starts = word_starts(e.word_ids)
        for c, (a, b) in enumerate(windows(len(ids), room, chunks.overlap, sent, para, starts)):
            pieces.append(np.concatenate([head, ids[a:b], suffix]))
            rec.append(r)
            chunk.append(c)
            cstart.append(int(offsets[a, 0]) if b > a else 0)
            cend.append(int(offsets[b - 1, 1]) if b > a else 0)
    lengths = np.fromiter((len(p) for p in pieces), np.int64, count=len(pieces))
    flat = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    tok = Tokenized(flat, lengths, np.zeros(len(pieces), bool))
    layout = Layout(np.asarray(rec, np.int64), np.asarray(chunk, np.int64), np.asarray(cstart, np.int64),
                    np.asarray(cend, np.int64), record_tokens, record_tokens.copy())
    return tok, layout
