"""A cheap, reversible word-piece tokenizer.

The gateway has no model tokenizer, and the emulator needs one that maps text to a
token sequence and back. A token is a word or a single punctuation character together
with the whitespace before it, so ``detokenize(tokenize(s)) == s`` for any ``s`` that
does not end in whitespace (trailing whitespace becomes its own token).
Real BPE tokenizers give ~1.3 tokens per English word; this gives ~1.1, close enough for
n-gram matching, which only needs equal text to give equal tokens.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text)


def detokenize(tokens: list[str]) -> str:
    return "".join(tokens)
