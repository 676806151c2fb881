"""Text utilities shared by the gateway and the emulator: a cheap tokenizer and the
prompt-lookup (n-gram) proposer that vLLM's ``ngram`` speculative method runs."""

from gateway.text.lookup import LookupStats, PromptLookupProposer, realised_lookup
from gateway.text.tokens import detokenize, tokenize

__all__ = ["LookupStats", "PromptLookupProposer", "detokenize", "realised_lookup", "tokenize"]
