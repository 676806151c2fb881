"""A cheap, reversible word-piece tokenizer.

The gateway has no model tokenizer, and the emulator needs one that maps text to a
token sequence and back. A token is a word or a single punctuation character together
with the whitespace before it, so ``detokenize(tokenize(s)) == s`` for any ``s`` that
does not end in whitespace (trailing whitespace becomes its own token).
Real BPE tokenizers give ~1.3 tokens per English word; this gives ~1.1, close enough for
n-gram matching, which only needs equal text to give equal tokens.

A reasoning model's think markers (``<think>``, ``</think>``) are one token each, as in
Qwen3's vocabulary, and the newlines right after one are a token of their own (a BPE
pre-tokenizer splits newlines from the word after them): the text of a generated
``<think>`` ``\\n`` reasoning ``\\n`` ``</think>`` ``\\n\\n`` content tokenizes back into the
tokens it was generated as.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")


_THINK = re.compile(r"(</?think>)")


def tokenize(text: str) -> list[str]:
    if "think>" not in text:
        return _TOKEN.findall(text)
    out: list[str] = []
    for i, part in enumerate(_THINK.split(text)):
        if i % 2:  # a marker
            out.append(part)
            continue
        if i:  # after a marker: its newlines are a token
            body = part.lstrip("\n")
            if len(body) < len(part):
                out.append(part[: len(part) - len(body)])
            part = body
        out.extend(_TOKEN.findall(part))
    return out


def detokenize(tokens: list[str]) -> str:
    return "".join(tokens)
