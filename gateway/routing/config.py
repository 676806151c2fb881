"""Routing configuration of one model (embedded in the gateway config under each model)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from gateway.physics import load_fitted
from gateway.routing.names import PolicyName


class RoutingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: PolicyName = Field(
        "adaptive",
        description="adaptive: the cost model; always-spec / always-base: static baselines; "
        "temperature: speculate at or below max_temperature",
    )
    max_temperature: float = Field(0.3, ge=0.0, le=2.0, description="threshold of the temperature policy")
    allow_client_override: bool = Field(
        False,
        description="honour the x-specgate-route: auto|spec|base request header (a client then pins "
        "engines for its requests; an operator's POST /admin/route pin still wins). Off by default",
    )
    override_keys: list[SecretStr] = Field(
        default_factory=list,
        description="with allow_client_override on: only requests bearing one of these client keys "
        "may use the header (empty: every client of the model)",
    )

    @model_validator(mode="after")
    def _keys_need_override(self) -> RoutingConfig:
        if self.override_keys and not self.allow_client_override:
            raise ValueError("override_keys is set but allow_client_override is off")
        return self

    @field_validator("profile")
    @classmethod
    def _profile_file_loads(cls, v: str) -> str:
        """A fitted profile's file is read at start: a missing or foreign file fails here,
        not as a silent fall-back to the built-in table."""
        if v.endswith(".json"):
            try:
                load_fitted(v)
            except (OSError, ValueError, TypeError, KeyError) as exc:
                raise ValueError(f"profile file {v!r}: {exc}") from exc
        return v

    # --- adaptive policy knobs -------------------------------------------------------
    profile: str = Field(
        "h200-qwen3-8b",
        description="calibration profile of step times T(batch, q) used as the prior: a shipped profile's "
        "name, or the path of a profile fitted on your GPU and model by `specgate profile-fit` (*.json)",
    )
    context_tokens: int = Field(1024, ge=1, le=1_000_000, description="context length the profile is read at")
    margin: float = Field(
        0.05,
        ge=0.0,
        le=2.0,
        description="speculate only when the predicted speed-up exceeds 1 + margin: a premium for "
        "speculation's risk (its slowdown grows with load, plain's does not)",
    )
    hysteresis: float = Field(
        0.02,
        ge=0.0,
        le=1.0,
        description="band around 1 + margin: the model leaves speculation below 1 + margin - band "
        "and comes back above 1 + margin + band",
    )
    switch_evidence: float = Field(
        0.1,
        gt=0.0,
        le=100.0,
        description="evidence a mode flip needs: the predicted speed-up's excess beyond the band, "
        "integrated over time, must reach this many speed-up x mean request decoding times (queue "
        "excluded, since a flip moves the queued requests; whole request durations with move_on_flip "
        "off; with 2-s requests, 0.1 is 0.02 beyond the band for 10 s or 0.2 beyond it for 1 s). A "
        "flip costs a drain of about one request's decoding; decisive changes flip in seconds, a "
        "prediction hovering near break-even never does",
    )
    persist_s: float = Field(
        30.0,
        ge=0.0,
        le=86400.0,
        description="in fallback, a predicted speed-up that stays above 1 + margin for this many "
        "seconds on balance (seconds above less seconds below), inside the band, flips to spec too: "
        "the band keeps noise from flapping the pair, not a steady edge from being taken; on spec the "
        "measured latency then decides whether it stays (0: off)",
    )
    move_on_flip: bool = Field(
        True,
        description="at a regime flip, move the streams still running on the old engine to the new one: "
        "the gateway stops relaying the old engine (which aborts the request there) and the new engine "
        "continues the answer from the text already sent (chat: continue_final_message; completions: "
        "the prompt plus that text), so both engines do not step side by side while the old one drains. "
        "Only streams whose continuation is exact move (n=1, no seed, logprobs, tools or structured "
        "output; see docs/moves.md); the others drain",
    )
    noise_z: float = Field(
        1.0,
        ge=0.0,
        le=10.0,
        description="the band widens by this many standard errors of the predicted speed-up (the "
        "mix window is a sample of the traffic): a prediction that sits near break-even only by "
        "chance does not flip the mode",
    )
    mix_window_s: float = Field(
        4.0,
        gt=0.0,
        le=600.0,
        description="the traffic mix the regimes are compared on: requests of the last this many "
        "seconds (shorter follows a change sooner, and is noisier)",
    )
    mix_min_requests: int = Field(
        8, ge=1, le=128, description="...but at least this many of the most recent requests"
    )
    mix_change_z: float = Field(
        4.0,
        ge=0.0,
        le=100.0,
        description="a change of traffic ends the mix window: when its newest requests (at least 3, at "
        "most a third of the window) price this many standard errors apart from the older ones, the older "
        "ones are dropped, so a shift is priced on the new traffic alone; off on a pair shared with other "
        "gateway replicas (0: off)",
    )
    probe_share: float = Field(
        0.01, ge=0.0, le=0.2, description="share of eligible traffic sent to spec as probes while in fallback"
    )
    probe_interval_s: float = Field(
        30.0, gt=0.0, le=3600.0, description="at least one probe per interval while in fallback"
    )
    probe_max_tokens: int = Field(
        512,
        ge=1,
        le=1_000_000,
        description="only requests with max_tokens at most this are used as probes (a probe slows the "
        "whole device while it runs, so short ones are cheap)",
    )
    prior_tokens_per_step: dict[str, float] = Field(
        default_factory=dict,
        description="override of the prior expected tokens per speculative step, per method "
        "(e.g. {'eagle3': 2.5}); n-gram priors come from the predicted overlap",
    )
    learn_half_life_s: float = Field(
        300.0, gt=0.0, le=86400.0, description="half-life of the learned per-class acceptance"
    )
    live_half_life_s: float = Field(
        10.0,
        gt=0.0,
        le=600.0,
        description="half-life of the live acceptance correction (the spec engine's windowed "
        "acceptance against what was expected of the requests that ran in that window)",
    )
    fit_step_times: bool = Field(
        True, description="correct the step-time profile by the engines' measured per-token latency"
    )
    recent_decisions: int = Field(64, ge=0, le=4096, description="decisions kept for GET /admin/state")
