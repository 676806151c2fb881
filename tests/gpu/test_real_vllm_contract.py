"""The gateway's scraper and request rules against pages and responses of REAL vLLM 0.20.2.

The fixtures come from the real-GPU run (loadtests/gpu/, results/gpu/): one plain and four
speculative engines (n-gram, EAGLE-3 at two synthetic acceptance levels, a draft model)
serving a random-weight Qwen3-8B on one H200. Synthetic acceptance makes the truth known
(per-position rates are configured), so the windowed statistics the gateway computes
from two real pages can be checked against it. No GPU is needed to run these tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.api.features import CHAT, COMPLETIONS, parse_request
from gateway.engines.parse import MetricsWindow, parse_metrics
from gateway.engines.scraper import MetricsScraper
from gateway.proxy.sse import Harvest
from tests.gpu.vllm_families import READ_BY_GATEWAY, REMOVED, SPEC_FAMILIES

FIX = Path(__file__).resolve().parent / "fixtures"
SPEC_ENGINES = {
    # name: (k, configured unconditional per-position rates or None)
    "ngram": (5, None),
    "eagle3-hi": (3, (0.8, 0.6, 0.45)),
    "eagle3-lo": (3, (0.4, 0.15, 0.05)),
    "draft-hi": (4, (0.85, 0.7, 0.55, 0.45)),
}


def page(name: str) -> str:
    return (FIX / f"{name}.txt").read_text()


def served(engine: str) -> str:
    return f"qwen3-8b-{engine}"


def families(text: str) -> dict[str, tuple[str, set[str]]]:
    out: dict[str, tuple[str, set[str]]] = {}
    for fam in text_string_to_metric_families(text):
        labels: set[str] = set()
        for s in fam.samples:
            labels |= set(s.labels) - {"le"}
        out[fam.name] = (fam.type, labels)
    return out


def counter(text: str, name: str, model: str) -> float:
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and s.labels.get("model_name") == model:
                total += s.value
    return total


def assert_gateway_families(text: str, speculative: bool) -> dict[str, tuple[str, set[str]]]:
    """Every family the gateway reads is on the page with its labels, none it no longer
    expects is, and the spec-decode families are there exactly on a speculative engine."""
    fams = families(text)
    for name in READ_BY_GATEWAY:
        assert name in fams, name
        assert {"model_name", "engine"} <= fams[name][1], name
    for name in REMOVED:
        assert name not in fams, name
    has_spec = [name in fams for name in SPEC_FAMILIES]
    assert all(has_spec) if speculative else not any(has_spec)
    return fams


@pytest.mark.parametrize("engine", ["base", *SPEC_ENGINES])
def test_every_family_the_gateway_reads_is_on_the_real_page(engine: str) -> None:
    fams = assert_gateway_families(page(f"final-{engine}"), speculative=engine != "base")
    if engine != "base":
        assert fams["vllm:spec_decode_num_accepted_tokens_per_pos"][1] == {"model_name", "engine", "position"}
        assert fams["vllm:spec_decode_num_drafts"][0] == "counter"


@pytest.mark.parametrize("engine", ["base", *SPEC_ENGINES])
def test_parser_reads_real_pages_and_filters_by_served_name(engine: str) -> None:
    text = page(f"final-{engine}")
    s = parse_metrics(text, served(engine))
    assert s.has_vllm_metrics
    assert s.generation_tokens is not None and s.generation_tokens > 0
    assert s.tpot_count is not None and s.tpot_count > 0
    assert s.kv_usage is not None and 0.0 <= s.kv_usage <= 1.0
    if engine == "base":
        # A plain engine has no spec counters: unknown, never zero.
        assert s.drafts is None and s.accepted is None and s.per_position is None
        assert not s.has_spec_metrics
    else:
        k, _ = SPEC_ENGINES[engine]
        assert s.has_spec_metrics
        assert s.per_position is not None and len(s.per_position) == k
        # The per-position counters add up to the accepted-token counter.
        assert sum(s.per_position) == pytest.approx(s.accepted)
        assert s.accepted == counter(text, "vllm:spec_decode_num_accepted_tokens_total", served(engine))
    # Another model's name selects nothing: every family is unknown, not zero.
    other = parse_metrics(text, "some-other-model")
    assert not other.has_vllm_metrics and other.generation_tokens is None


@pytest.mark.parametrize("engine", ["eagle3-hi", "draft-hi"])
def test_windowed_acceptance_from_two_real_pages_matches_the_configured_rates(engine: str) -> None:
    before, after = page(f"{engine}-c16-before"), page(f"{engine}-c16-after")
    scraper = MetricsScraper(None, "http://unused", model_name=served(engine), window_s=60.0)  # type: ignore[arg-type]
    scraper.ingest(before, now=100.0)
    scraper.ingest(after, now=110.0)
    state = scraper.current(now=110.0)
    assert not state.stale and state.has_spec_metrics
    st = state.stats
    assert st is not None and st.per_position is not None and st.acceptance_rate is not None
    _, rates = SPEC_ENGINES[engine]
    assert rates is not None
    # Ground truth: the rates the engine was started with (synthetic rejection sampling).
    assert st.per_position == pytest.approx(rates, abs=0.05)
    assert st.mean_acceptance_length == pytest.approx(1 + sum(rates), abs=0.1)
    assert st.acceptance_rate == pytest.approx(sum(rates) / len(rates), abs=0.04)
    # Independent computation from the raw counters of the same two pages.
    name = served(engine)
    d_acc = counter(after, "vllm:spec_decode_num_accepted_tokens_total", name) - counter(
        before, "vllm:spec_decode_num_accepted_tokens_total", name
    )
    d_tok = counter(after, "vllm:spec_decode_num_draft_tokens_total", name) - counter(
        before, "vllm:spec_decode_num_draft_tokens_total", name
    )
    assert st.acceptance_rate == pytest.approx(d_acc / d_tok)
    # Every step of a model-based proposer drafts: tokens per step = AL.
    assert st.tokens_per_step == pytest.approx(st.mean_acceptance_length, rel=0.03)
    assert st.tpot_s is not None and 0.001 < st.tpot_s < 0.1


def test_ngram_drafted_step_acceptance_overstates_tokens_per_step() -> None:
    """Real n-gram: steps without a prompt-lookup match draft nothing and are not counted,
    so acceptance over drafted steps (here ~1.0: the random-weight model repeats itself
    at temperature 0) says nothing about the sampled requests that never draft. The
    gateway's tokens-per-step over all generated tokens is the honest figure."""
    w = MetricsWindow(window_s=60.0)
    w.add(0.0, parse_metrics(page("ngram-c16-before"), served("ngram")))
    st = w.add(10.0, parse_metrics(page("ngram-c16-after"), served("ngram")))
    assert st.acceptance_rate is not None and st.acceptance_rate > 0.95
    assert st.mean_acceptance_length is not None and st.mean_acceptance_length > 5.5
    assert st.tokens_per_step is not None
    assert st.tokens_per_step < st.mean_acceptance_length - 2.0


def _probe() -> dict[str, dict[str, dict[str, object]]]:
    data: dict[str, dict[str, dict[str, object]]] = json.loads((FIX / "probe.json").read_text())
    return data


@pytest.mark.parametrize("engine", list(SPEC_ENGINES))
def test_refused_parameters_contract_of_a_real_speculative_engine(engine: str) -> None:
    p = _probe()[engine]
    # logit_bias: HTTP 400 with an OpenAI-shaped error body...
    r = p["refused_logit_bias"]
    assert r["status"] == 400
    err = json.loads(str(r["body"]))["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError" and "logit_bias" in err["message"]
    # ...and in a stream: HTTP 200, one error event, then [DONE].
    s = p["refused_logit_bias_stream"]
    assert s["status"] == 200
    events = [ln[6:] for ln in str(s["body"]).splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) == 2
    h = Harvest()
    h.take(json.loads(events[0]))
    assert h.error == "engine_error"
    # min_p at temperature 0 is accepted (vLLM resets min_p for greedy sampling); it is
    # refused only when sampling. The gateway conservatively sends any min_p > 0 to base.
    assert p["refused_min_p"]["status"] == 200


def test_gateway_marks_what_the_real_engine_refuses() -> None:
    def refused(body: dict[str, object]) -> tuple[str, ...]:
        return parse_request(body, COMPLETIONS, None, allow_override=True).features.refused_params

    base = {"model": "qwen3-8b", "prompt": "hi", "temperature": 0.7}
    assert refused({**base, "logit_bias": {"5": 1.0}}) == ("logit_bias",)
    assert refused({**base, "min_p": 0.1}) == ("min_p",)
    assert refused({**base, "logit_bias": {}}) == ()  # vLLM accepts an empty bias (falsy)
    assert refused(base) == ()
    chat = {"model": "qwen3-8b", "messages": [{"role": "user", "content": "x"}], "min_p": 0.2}
    assert parse_request(chat, CHAT, None, allow_override=True).features.refused_params == ("min_p",)


@pytest.mark.parametrize("engine", ["base", "eagle3-hi"])
def test_real_stream_shape_and_usage_harvest(engine: str) -> None:
    p = _probe()[engine]
    for key, want_role in (("stream", False), ("chat_stream", True)):
        r = p[key]
        assert r["status"] == 200 and str(r["content_type"]).startswith("text/event-stream")
        events = [ln[6:] for ln in str(r["body"]).splitlines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]"
        objs = [json.loads(e) for e in events[:-1]]
        # include_usage: the last chunk has no choices and carries usage.
        assert objs[-1]["choices"] == [] and objs[-1]["usage"]["completion_tokens"] > 0
        finishes = [c.get("finish_reason") for o in objs for c in o["choices"]]
        assert finishes.count("length") == 1 and finishes[-1] == "length"
        if want_role:
            assert objs[0]["choices"][0]["delta"].get("role") == "assistant"
        h = Harvest()
        got = sum(h.take(o) for o in objs)
        assert got > 0 and h.error is None
        assert h.completion_tokens == objs[-1]["usage"]["completion_tokens"]
        assert h.prompt_tokens == objs[-1]["usage"]["prompt_tokens"]


@pytest.mark.parametrize("engine", list(SPEC_ENGINES))
def test_emulator_accepts_the_speculative_configs_real_vllm_accepted(engine: str) -> None:
    from specgate_lab.emulator.spec import parse_spec_config

    cfg = dict(_probe()[engine]["spec"])  # as started on the GPU, minus the draft folder
    if cfg["method"] != "ngram":
        cfg["model"] = "/models/draft"
    sc = parse_spec_config(cfg)
    assert sc.k == SPEC_ENGINES[engine][0]
    assert sc.synthetic == (cfg.get("rejection_sample_method") == "synthetic")


@pytest.mark.parametrize("method", ["strict", "probabilistic"])
def test_emulator_accepts_vllm_rejection_sample_methods(method: str) -> None:
    from specgate_lab.emulator.spec import parse_spec_config

    sc = parse_spec_config(
        {"method": "eagle3", "model": "x", "num_speculative_tokens": 3, "rejection_sample_method": method}
    )
    assert not sc.synthetic and sc.k == 3


def _shape(text: str) -> dict[str, tuple[str, frozenset[str], tuple[str, ...]]]:
    out: dict[str, tuple[str, frozenset[str], tuple[str, ...]]] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("vllm:") or fam.name == "vllm:cache_config_info":
            continue
        labels: set[str] = set()
        les: list[str] = []
        for s in fam.samples:
            labels |= set(s.labels) - {"le"}
            if s.name.endswith("_bucket") and s.labels["le"] not in les:
                les.append(s.labels["le"])
        out[fam.name] = (fam.type, frozenset(labels), tuple(les))
    return out


@pytest.mark.parametrize("engine", ["base", *SPEC_ENGINES])
def test_emulator_page_has_the_real_page_shape_for_every_method(engine: str) -> None:
    """Every vllm:* family of the real page (n-gram, EAGLE-3, draft model, plain) exists on
    the emulator's page of an engine started with the same --speculative-config, with the
    same type, label names and histogram buckets, and nothing else."""
    from specgate_lab.emulator.device import Device
    from specgate_lab.emulator.engine import Engine, EngineConfig
    from specgate_lab.emulator.metrics import EngineMetrics
    from specgate_lab.emulator.spec import parse_spec_config

    spec = None
    if engine != "base":
        cfg = dict(_probe()[engine]["spec"])
        if cfg["method"] != "ngram":
            cfg["model"] = "/models/draft"
        spec = parse_spec_config(cfg)
    ec = EngineConfig(served(engine), spec=spec, max_num_seqs=64, max_model_len=2048)
    m = EngineMetrics(ec.served_model_name, spec_k=spec.k if spec else None, max_model_len=2048)
    dev = Device()
    eng = dev.attach(Engine(ec, observer=m))
    m.engine = eng
    for i in range(3):
        dev.submit(
            eng, eng.make_request("Return this list unchanged: a, b, c, d.", max_tokens=24, seed=i), 0.0
        )
    while (t := dev.next_event_time()) is not None:
        dev.run_until(t)
    real, ours = _shape(page(f"final-{engine}")), _shape(m.render().decode())
    assert ours == real
