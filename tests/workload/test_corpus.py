from __future__ import annotations

import ast
import io
import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest

import specgate_lab.workload as wl
from gateway.text import realised_lookup, tokenize
from specgate_lab.workload.code import generate_module
from specgate_lab.workload.export import main as export_main
from specgate_lab.workload.export import rows, write_jsonl


def _prompts(seed: int, n: int, **kw: object) -> list[wl.WorkloadRequest]:
    return list(wl.iter_requests(seed, n, **kw))  # type: ignore[arg-type]


def test_same_seed_same_requests_other_seed_other_requests() -> None:
    a, b, c = _prompts(7, 50), _prompts(7, 50), _prompts(8, 50)
    assert a == b
    assert [r.messages for r in a] != [r.messages for r in c]


def test_corpus_is_too_diverse_to_memorise() -> None:
    reqs = _prompts(1, 600, mix="edit=0.5,summary=0.3,rag=0.2")
    distinct = {r.prompt_text for r in reqs}
    assert len(distinct) == len(reqs)


def test_mix_is_respected() -> None:
    only_chat = _prompts(3, 40, mix="chat=1")
    assert {r.kind for r in only_chat} == {"chat"}
    reqs = _prompts(3, 2000, mix={"edit": 0.5, "summary": 0.25, "rag": 0.0, "chat": 0.25})
    counts = Counter(r.kind for r in reqs)
    assert counts["rag"] == 0
    assert 0.45 < counts["edit"] / 2000 < 0.55
    assert 0.2 < counts["chat"] / 2000 < 0.3
    subs = _prompts(3, 30, mix="quote=1")
    assert {(r.kind, r.subkind) for r in subs} == {("summary", "quote")}


@pytest.mark.parametrize("bad", ["bogus=1", "edit=-1", "edit=0", "edit=x"])
def test_bad_mix_is_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        wl.parse_mix(bad)


def test_temperature_distributions() -> None:
    rng = random.Random(0)
    assert {wl.TemperatureDist.parse("0.7").sample(rng) for _ in range(10)} == {0.7}
    u = [wl.TemperatureDist.parse("uniform:0.2:0.4").sample(rng) for _ in range(200)]
    assert min(u) >= 0.2 and max(u) <= 0.4 and len(set(u)) > 20
    m = Counter(wl.TemperatureDist.parse("mix:0=0.9,1=0.1").sample(rng) for _ in range(1000))
    assert set(m) == {0.0, 1.0} and m[0.0] > 800
    c = {wl.TemperatureDist.parse("choice:0,0.5,1").sample(rng) for _ in range(100)}
    assert c == {0.0, 0.5, 1.0}
    reqs = _prompts(2, 30, temperature="uniform:0:1")
    assert all(0 <= r.temperature <= 1 for r in reqs)


@pytest.mark.parametrize("bad", ["3", "-0.1", "uniform:1:0", "mix:0=-1", "choice:", "hot"])
def test_bad_temperature_spec_is_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        wl.TemperatureDist.parse(bad)


def test_generated_code_is_valid_python_in_every_form() -> None:
    for seed in range(120):
        m = generate_module(random.Random(seed))
        forms = [m.plain, m.render(typed=True), m.render(documented=True)]
        forms += [m.render(const_slot=slot) for slot, _, _ in m.constants]
        for src in forms:
            ast.parse(src)
        assert m.functions


def _code(reference: str) -> str:
    return reference.removeprefix("```python\n").removesuffix("```")


def test_edit_references_are_exact_edits() -> None:
    for r in _prompts(5, 120, mix="edit=1"):
        prompt = r.messages[-1]["content"]
        ref = _code(r.reference or "")
        ast.parse(ref)
        if r.subkind == "rename":
            old, new = re.findall(r"`?(\w+)`? (?:to|->|should be called) `?(\w+)`?", prompt)[0]
            assert re.search(rf"\b{old}\b", prompt)
            assert not re.search(rf"\b{old}\b", ref) and re.search(rf"\b{new}\b", ref)
        elif r.subkind == "typehints":
            assert "->" in ref and "->" not in prompt.split("```")[0]
        elif r.subkind == "constant":
            name = re.search(r"\b([A-Z][A-Z0-9_]+)\b", prompt.split("\n\n")[0] + prompt)
            assert name is not None and re.search(rf"^{name.group(1)} = ", ref, re.MULTILINE)


def test_overlap_of_reference_answers_orders_the_kinds() -> None:
    rates: dict[str, list[float]] = {}
    for r in _prompts(11, 300):
        assert r.max_tokens >= 16
        if r.reference is None:
            assert r.subkind in ("chat", "summarize")
            continue
        st = realised_lookup(tokenize(r.prompt_text), tokenize(r.reference), k=5)
        rates.setdefault(r.subkind, []).append(st.acceptance_rate)
    mean = {k: sum(v) / len(v) for k, v in rates.items()}
    assert mean["rename"] > 0.8 and mean["constant"] > 0.8
    assert mean["typehints"] > 0.4
    assert min(mean.values()) > 0.2


def test_extraction_quote_and_rag_answers_copy_the_prompt() -> None:
    for r in _prompts(4, 60, mix="extract=1,quote=1,rag=1"):
        assert r.reference
        if r.subkind == "extract":
            for rec in json.loads(r.reference):
                assert all(v in r.prompt_text for v in rec.values())
        elif r.subkind == "quote":
            assert all(line in r.prompt_text for line in r.reference.splitlines())
        else:
            sentence, cite = r.reference.rsplit(" [", 1)
            assert sentence in r.prompt_text and f"[{cite}" in r.prompt_text


def test_openai_body() -> None:
    r = next(wl.iter_requests(1, 1, mix="chat=1", temperature=0.3))
    body = wl.to_openai_body(r, "m")
    assert body["model"] == "m" and body["stream"] is True and body["temperature"] == 0.3
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"][-1]["role"] == "user" and body["max_tokens"] == r.max_tokens
    plain = wl.to_openai_body(r, "m", stream=False, extra={"top_p": 0.9})
    assert "stream_options" not in plain and plain["top_p"] == 0.9


def test_max_tokens_cap() -> None:
    assert all(r.max_tokens <= 100 for r in _prompts(9, 50, max_tokens_cap=100))


def test_export_vllm_format(tmp_path: Path) -> None:
    out = io.StringIO()
    n = write_jsonl(rows("vllm", wl.iter_requests(1, 5), "m"), out)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert n == 5 and all(set(x) == {"prompt", "output_tokens"} for x in lines)
    path = tmp_path / "c.jsonl"
    assert export_main(["--n", "4", "--format", "openai", "--out", str(path)]) == 0
    assert len(path.read_text().splitlines()) == 4


def test_corpus_package_is_small() -> None:
    pkg = Path(wl.__file__).parent
    assert sum(p.stat().st_size for p in pkg.rglob("*.py")) < 200_000
