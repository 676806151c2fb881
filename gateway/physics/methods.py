"""The one vocabulary of speculative decoding methods, and what kind of proposer each is.

Every module that names a method or sorts methods into kinds (the config schema, the
emulator's ``--speculative-config`` parser, the step-time physics, the routing core's
acceptance priors and step-time prior, the simulator) imports it from here. It imports
nothing from the gateway, so every layer may use it.
"""

from __future__ import annotations

from typing import Literal, get_args

# vLLM's speculative methods: what the gateway's config and the emulator accept.
SpecMethod = Literal[
    "ngram",
    "ngram_gpu",
    "suffix",
    "draft_model",
    "eagle",
    "eagle3",
    "mtp",
    "medusa",
    "mlp_speculator",
]
METHODS: tuple[str, ...] = get_args(SpecMethod)

# The emulator accepts vLLM's legacy spelling of the n-gram proposer as well.
LEGACY_NGRAM = "[ngram]"

# Proposers that look drafts up in the text (the prompt and the output so far): host work
# only, no GPU model, and their acceptance follows how much of the answer copies the prompt.
# ``prompt_lookup`` is the name prompt-lookup decoding goes by outside vLLM (vLLM calls it
# ``ngram``): no config accepts it, but a method name read anywhere classifies it as n-gram.
NGRAM_METHODS = frozenset({"ngram", "ngram_gpu", "suffix", "prompt_lookup"})
# The n-gram proposers configured by ``prompt_lookup_min`` / ``prompt_lookup_max``.
PROMPT_LOOKUP_METHODS = frozenset({"ngram", "ngram_gpu"})
# A separate small draft model, run once per draft token.
DRAFT_MODEL = "draft_model"
# Heads on the target model run once per draft token (EAGLE-style, multi-token prediction).
HEAD_METHODS = frozenset({"eagle", "eagle3", "mtp"})
# Heads that propose all k tokens in one pass.
ONE_PASS_METHODS = frozenset({"medusa", "mlp_speculator"})
# Every method whose proposer is a model (a draft model or heads) rather than a text lookup.
MODEL_METHODS = frozenset({DRAFT_MODEL}) | HEAD_METHODS | ONE_PASS_METHODS
