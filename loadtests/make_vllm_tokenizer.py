"""Write the tiny tokenizer directory ``vllm bench serve --tokenizer`` loads offline.

It counts tokens the way specgate's own tokenizer does (a word or a punctuation run is a
token), so prompt and output lengths are comparable with the gateway's estimates; every
word maps to one unknown id. Needs the ``tokenizers`` package (it comes with vLLM):

    .venv-vllm/bin/python loadtests/make_vllm_tokenizer.py loadtests/vllm-tokenizer
"""

import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

out = sys.argv[1] if len(sys.argv) > 1 else "loadtests/vllm-tokenizer"
os.makedirs(out, exist_ok=True)
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.decoder = decoders.WordPiece()
tok.save(os.path.join(out, "tokenizer.json"))
config = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "</s>",
    "unk_token": "<unk>",
    "model_max_length": 32768,
    "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
}
with open(os.path.join(out, "tokenizer_config.json"), "w") as fh:
    json.dump(config, fh, indent=1)
    fh.write("\n")
print("wrote", out)
