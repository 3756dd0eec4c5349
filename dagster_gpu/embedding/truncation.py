"""Count texts longer than the model's max sequence length, tokenizing only those that might be.

A (WordPiece, BPE, byte-level BPE, SentencePiece with byte fallback) token covers at least one UTF-8
byte, so a text of ``b`` bytes has at most ``b`` tokens, plus the special tokens (at most 3: CLS/SEP or
BOS/EOS and a SentencePiece prefix). Texts with ``b + 3 <= max_seq_length`` cannot be truncated and are
not tokenized; the rest are tokenized exactly.
"""

from __future__ import annotations

from typing import Sequence

SPECIAL_TOKEN_ALLOWANCE = 3


def count_truncated(tokenizer, texts: Sequence[str], max_seq_length: int) -> int:
    """Number of ``texts`` whose token count (with special tokens) exceeds ``max_seq_length``."""
    candidates = [t for t in texts if len(t.encode("utf-8")) + SPECIAL_TOKEN_ALLOWANCE > max_seq_length]
    if not candidates:
        return 0
    enc = tokenizer(candidates, add_special_tokens=True, truncation=False, return_attention_mask=False)
    return sum(1 for ids in enc["input_ids"] if len(ids) > max_seq_length)


def record_token_counts(tokenizer, texts: Sequence[str], add_special_tokens: bool = False):
    """Tokens of each of ``texts`` alone, untruncated (a ``transformers`` tokenizer), int64 [len(texts)]."""
    import numpy as np

    if not texts:
        return np.zeros(0, np.int64)
    enc = tokenizer(list(texts), add_special_tokens=add_special_tokens, truncation=False,
                    return_attention_mask=False, verbose=False)
    return np.asarray([len(ids) for ids in enc["input_ids"]], np.int64)
