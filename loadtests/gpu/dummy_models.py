"""Write config + tokenizer folders for random-weight models that vLLM serves with
``--load-format dummy`` (no weights to download):

* ``qwen3-8b``       the target (Qwen3-8B shape),
* ``qwen3-0.6b``     a draft model for ``method: draft_model`` (Qwen3-0.6B shape),
* ``qwen3-8b-eagle3`` an EAGLE-3 head for the 8B target (one Llama layer, 32k draft vocab,
  the shape of the public Qwen3-8B EAGLE-3 heads).

The tokenizer is a WordLevel vocabulary of 151936 entries: first every word and
punctuation mark that specgate's prompt corpus uses (so prompts tokenize to distinct ids,
one token per word or punctuation mark, like specgate's own estimate), then fillers
``t<i>``. Needs the ``tokenizers`` package (it ships with vLLM and transformers).

    python3 loadtests/gpu/dummy_models.py OUTDIR
"""

from __future__ import annotations

import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

VOCAB = 151936
SPECIAL = ("<unk>", "<|endoftext|>", "<|im_end|>")
BOS_ID, EOS_ID = 151643, 151645  # Qwen3's ids; the vocabulary puts the special tokens there


def corpus_words(samples: int = 4000, seed: int = 12345) -> list[str]:
    """Every distinct word / punctuation mark in ``samples`` corpus requests (sorted)."""
    from gateway.text import tokenize
    from specgate_lab.workload import sample

    rng = random.Random(seed)
    words: set[str] = set()
    for _ in range(samples):
        req = sample(rng, "default", "uniform:0:1", max_tokens_cap=256)
        for m in req.messages:
            words.update(t.strip() for t in tokenize(m["content"]))
    words.discard("")
    return sorted(words)


def vocabulary(words: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {"<unk>": 0}
    for w in words:
        if len(vocab) >= BOS_ID - 1:
            break
        vocab.setdefault(w, len(vocab))
    i = 0
    while len(vocab) < BOS_ID:
        vocab.setdefault(f"t{i}", len(vocab))
        i += 1
    vocab["<|endoftext|>"] = BOS_ID
    vocab[f"t{i}"] = BOS_ID + 1
    vocab["<|im_end|>"] = EOS_ID
    n = BOS_ID + 1
    while len(vocab) < VOCAB:
        i += 1
        n += 1
        if n == EOS_ID:
            n += 1
        vocab[f"t{i}"] = n
    assert sorted(vocab.values()) == list(range(VOCAB)), "ids must be 0..V-1 exactly once"
    return vocab


def write_tokenizer(d: str, vocab: dict[str, int]) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # One token per word or single punctuation character, like gateway.text.tokenize.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(r"\w+|[^\w\s]"), behavior="isolated")]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    tok.save(os.path.join(d, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "bos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<unk>",
        "model_max_length": 40960,
        "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
    }
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump(cfg, fh)


BASE = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": VOCAB,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "use_cache": True,
    "sliding_window": None,
    "use_sliding_window": False,
    "rope_scaling": None,
    "initializer_range": 0.02,
    "head_dim": 128,
}

SHAPES: dict[str, dict[str, object]] = {
    "qwen3-8b": {
        **BASE,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_window_layers": 36,
        "tie_word_embeddings": False,
    },
    "qwen3-0.6b": {
        **BASE,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "max_window_layers": 28,
        "tie_word_embeddings": True,
    },
    "qwen3-8b-eagle3": {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "draft_vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 1,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "initializer_range": 0.02,
    },
}


def main(out: str) -> int:
    vocab = vocabulary(corpus_words())
    for name, cfg in SHAPES.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        write_tokenizer(d, vocab)
        with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as fh:
            json.dump(cfg, fh, indent=1)
        with open(os.path.join(d, "generation_config.json"), "w", encoding="utf-8") as fh:
            json.dump({"bos_token_id": BOS_ID, "eos_token_id": EOS_ID}, fh)
    print(f"wrote {', '.join(SHAPES)} under {out} ({VOCAB} ids, corpus words first)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else ".vmodels"))
