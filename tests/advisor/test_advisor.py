"""The advisor on handmade answers whose n-gram acceptance is known exactly, and the
``specgate advise`` command on a log with good and bad records."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import pytest

from gateway import cli
from gateway.advisor.replay import answer_of, replay
from gateway.advisor.report import Advice
from gateway.pipeline.outcome import LookupSettings
from gateway.routing.steptime import get_step_model
from specgate_lab.advisor import cli as advise_cli
from specgate_lab.workload.export import main as export_main

WORDS = " ".join(f"w{i}" for i in range(1, 13))
COPY_PROMPT = f"Copy this: {WORDS} end"
COPY_ANSWER = " " + WORDS  # 12 word pieces, all in the prompt
SETTINGS = LookupSettings(k=5, n_min=2, n_max=5)


def chat(prompt: str, temperature: float) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": prompt}], "temperature": temperature}


def test_a_copied_answer_replays_as_vllm_would_draft_it() -> None:
    """By hand: step 1 is the prefill's (w1, no draft), step 2 finds no earlier "end w1",
    step 3 matches "w1 w2" and has w3..w7 accepted (6 tokens out), step 4 would draft
    w9..end but, the answer cut at max_tokens, drafts only the 3 tokens left less one,
    w9..w11, all accepted (4 out): 4 steps, 2 drafted, 8 drafted tokens, 8 accepted."""
    r = replay(chat(COPY_PROMPT, 0.0), COPY_ANSWER, SETTINGS)
    assert r is not None and r.kind == "chat" and r.bucket == 0
    st = r.stats
    assert (st.steps, st.drafts, st.draft_tokens, st.accepted, st.output_tokens) == (4, 2, 8, 8, 12)
    assert st.acceptance_rate == pytest.approx(1.0)
    assert st.mean_acceptance_length == pytest.approx(5.0)


def test_an_answer_that_ended_on_a_stop_can_have_its_last_token_accepted() -> None:
    """Ended on its end-of-sequence token (not shown in the text), the answer's last step
    samples that token: step 4 then has w9..w12 all accepted (9 in all, not 8). Cut at
    max_tokens, the last token is always sampled."""
    r = replay(chat(COPY_PROMPT, 0.0), COPY_ANSWER, SETTINGS, stopped=True)
    assert r is not None
    assert (r.stats.steps, r.stats.drafts, r.stats.draft_tokens, r.stats.accepted) == (4, 2, 10, 9)
    assert answer_of({"choices": [{"text": "a b", "finish_reason": "stop"}]}) == ("a b", True)
    assert answer_of({"choices": [{"text": "a b", "finish_reason": "length"}]}) == ("a b", False)


def test_an_answer_that_copies_nothing_drafts_nothing() -> None:
    r = replay(chat("hello there", 1.0), " zz yy xx", SETTINGS)
    assert r is not None and r.bucket == 3
    assert (r.stats.steps, r.stats.drafts, r.stats.accepted) == (3, 0, 0)


def test_bad_records_are_not_replayed() -> None:
    assert replay({"model": "m"}, "some answer text", SETTINGS) is None  # neither messages nor prompt
    assert replay(chat("hi", 5.0), "an answer", SETTINGS) is None  # temperature out of range
    assert replay("not a body", "an answer", SETTINGS) is None
    assert replay(chat("hi", 0.0), "x", SETTINGS) is None  # one token says nothing
    with pytest.raises(ValueError):
        LookupSettings(k=0)
    assert answer_of({"choices": [{"message": {"content": "a b"}}]}) == ("a b", False)
    assert answer_of({"choices": [{"text": "c d"}]}) == ("c d", False)
    assert answer_of({"choices": []}) is None and answer_of(None) is None


def test_classes_aggregate_and_the_prediction_follows_acceptance() -> None:
    adv = Advice(SETTINGS)
    for _ in range(3):
        adv.add(replay(chat(COPY_PROMPT, 0.0), COPY_ANSWER, SETTINGS))
        adv.add(replay(chat("hello there", 1.0), " zz yy xx", SETTINGS))
    adv.add(None)
    assert adv.skipped == 1 and adv.ngram.total.requests == 6
    copy, none = adv.ngram.classes[("chat", 0)], adv.ngram.classes[("chat", 3)]
    assert (copy.requests, copy.counts.steps, copy.counts.drafts, copy.counts.accepted) == (3, 12, 6, 24)
    assert copy.drafted_share == pytest.approx(0.5) and copy.tokens_per_step == pytest.approx(3.0)
    assert none.acceptance_rate is None and none.tokens_per_step == pytest.approx(1.0)
    # all: 36 + 9 answer tokens over 12 + 9 steps
    assert adv.ngram.total.tokens_per_step == pytest.approx(45 / 21)
    steps = get_step_model("h200-qwen3-8b", 512)
    light, heavy = adv.ngram.predict(steps, [1, 256], copy)
    assert light.speedup > 2.0  # three tokens a step for almost the price of one
    assert heavy.speedup < light.speedup  # verification grows dear with the batch
    # nothing drafted: a spec step costs at least a plain one, at every load
    assert all(p.speedup <= 1.0 for p in adv.ngram.predict(steps, [1, 8, 64], none))
    be = adv.ngram.break_even(steps, none)
    assert be is not None and be.load == 1
    be_copy = adv.ngram.break_even(steps, copy)
    assert be_copy is None or be_copy.load > 64


def test_the_advise_command_writes_its_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(advise_cli, "MAX_LINE_BYTES", 4096)
    log = tmp_path / "log.jsonl"
    copy_resp = {"choices": [{"message": {"role": "assistant", "content": COPY_ANSWER}}]}
    lines = [json.dumps({"request": chat(COPY_PROMPT, 0.0), "response": copy_resp}) for _ in range(4)]
    lines.append(json.dumps({"request": {"model": "m", "prompt": "hello there"}, "answer": " zz yy xx"}))
    lines += ["{not json", json.dumps([1, 2]), json.dumps({"request": {"model": "m"}, "answer": "a b c"})]
    lines.append(json.dumps({"request": chat("x" * 8000, 0.0), "answer": "too long a line"}))
    log.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    out = tmp_path / "adv"
    assert cli.main(["advise", "--log", str(log), "--out", str(out), "--loads", "1,64"]) == 0
    report = json.loads((out / "advice.json").read_text(encoding="utf-8"))
    assert report["all"]["requests"] == 5 and report["skipped"] == 4
    assert report["settings"] == {
        "k": 5,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
        "profile": "h200-qwen3-8b",
    }
    [copy] = [c for c in report["classes"] if c["temperature"] == "T ≤ 0.05"]
    assert copy["requests"] == 4 and copy["acceptance_rate"] == pytest.approx(1.0)
    assert [p["load"] for p in report["predictions"]] == [1.0, 64.0]
    md = (out / "advice.md").read_text(encoding="utf-8")
    assert "| chat, T ≤ 0.05 | 4 | 50 % | 100 % | 5.00 | 3.00 |" in md
    assert "cannot be replayed without their weights" in md
    # the suffix replay beside the n-gram one, and the plot of both by load
    assert report["suffix"]["all"]["requests"] == 5 and report["suffix"]["settings"]["k"] == 24
    svg = ElementTree.fromstring((out / "speedup.svg").read_text(encoding="utf-8"))
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 2 and all(len(line.get("points", "").split()) == 10 for line in lines)
    assert cli.main(["advise", "--log", str(log), "--out", str(out), "--no-suffix"]) == 0
    assert "suffix" not in json.loads((out / "advice.json").read_text(encoding="utf-8"))
    with pytest.raises(SystemExit, match="no usable record"):
        empty = tmp_path / "empty.jsonl"
        empty.write_text("{}\n", encoding="utf-8")
        cli.main(["advise", "--log", str(empty), "--out", str(out)])
    with pytest.raises(SystemExit, match="--loads"):
        cli.main(["advise", "--log", str(log), "--out", str(out), "--loads", "0"])


def test_the_corpus_exports_what_advise_reads(tmp_path: Path) -> None:
    """``python -m specgate_lab.workload --format advise`` writes the corpus requests that have a
    reference answer as {request, answer} records, which the command replays whole."""
    log = tmp_path / "corpus.jsonl"
    assert export_main(["--n", "60", "--seed", "3", "--format", "advise", "--out", str(log)]) == 0
    recs = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert recs and all(set(r) == {"request", "answer"} and r["answer"] for r in recs)
    assert all(r["request"]["stream"] is False for r in recs)
    out = tmp_path / "adv"
    assert cli.main(["advise", "--log", str(log), "--out", str(out)]) == 0
    report = json.loads((out / "advice.json").read_text(encoding="utf-8"))
    assert report["all"]["requests"] == len(recs) and report["skipped"] == 0
    # reference answers of edits copy their prompt: most of their drafted tokens are accepted
    edits = [c for c in report["classes"] if c["kind"] == "edit"]
    assert edits and all(c["acceptance_rate"] > 0.5 for c in edits)
