"""The gateway's configuration schema (pydantic v2).

One YAML file describes the HTTP server, the metric scraper, the telemetry and, per
model, the engine pairs (a speculative and a plain vLLM engine sharing one device),
timeouts, retry policy and the routing policy. Every section forbids unknown keys so
that a typo is an error, not a silently ignored setting.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

from gateway.config.discovery import DiscoveryConfig, FleetConfig
from gateway.config.epp import EppConfig
from gateway.config.telemetry import TelemetryConfig
from gateway.physics.methods import PROMPT_LOOKUP_METHODS, SpecMethod
from gateway.routing.config import RoutingConfig

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def _check_name(value: str, what: str) -> str:
    if not _NAME_RE.fullmatch(value):
        raise ValueError(
            f"{what} must be 1-128 characters of letters, digits, '.', '_', ':' or '-' "
            f"(starting with a letter or digit), got {value!r}"
        )
    return value


def _split_keys(v: Any) -> Any:
    if isinstance(v, str):
        return [k.strip() for k in v.split(",") if k.strip()]
    return v


def _check_keys(v: list[SecretStr]) -> list[SecretStr]:
    for key in v:
        raw = key.get_secret_value()
        if len(raw) < 8 or any(c.isspace() for c in raw):
            raise ValueError("every key must be at least 8 characters without whitespace")
    return v


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class ServerConfig(_Strict):
    host: str = Field("127.0.0.1", description="address to listen on (0.0.0.0 for all interfaces)")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0 picks a free one)")
    max_body_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="largest accepted request body; larger gets 413"
    )
    max_json_containers: int = Field(
        20_000,
        ge=16,
        le=10_000_000,
        description="most JSON objects/arrays a request body may hold (counted on the bytes, before "
        "parsing); more gets 400: each costs ~100 bytes of memory once parsed",
    )
    max_json_elements: int = Field(
        200_000, ge=16, le=100_000_000, description="most JSON values a request body may hold; more gets 400"
    )
    max_concurrency: int = Field(
        1024, ge=1, description="requests in flight at once; beyond it clients get 429 + Retry-After"
    )
    api_keys: list[SecretStr] = Field(
        default_factory=list,
        description="client keys for 'Authorization: Bearer <key>'; empty disables client auth",
    )
    admin_keys: list[SecretStr] = Field(
        default_factory=list,
        description="keys for /admin/*; when empty, admin endpoints answer only loopback clients of a "
        "loopback listener, without proxy headers (docs/security.md)",
    )
    metrics_require_key: bool | None = Field(
        None,
        description="require a server client key or an admin key for GET /metrics; "
        "null (default): required when some model has api_keys of its own (metric labels name models)",
    )
    forward_headers: list[str] = Field(
        default_factory=list,
        description="client header names forwarded to engines besides the built-in allow-list "
        "(accept, user-agent, traceparent, tracestate, baggage, x-request-id)",
    )
    header_timeout_s: float = Field(
        10.0, gt=0.0, le=600.0, description="a request's headers must arrive within this; else closed"
    )
    keepalive_timeout_s: float = Field(
        75.0, gt=0.0, le=3600.0, description="idle keep-alive connections are closed after this"
    )
    max_connections: int = Field(
        4096, ge=1, description="open client connections at once; beyond it a new one gets 503 and is closed"
    )
    shutdown_grace_s: float = Field(
        10.0, ge=0.0, le=3600.0, description="on SIGTERM, time given to requests in flight"
    )
    log_json: bool = Field(False, description="log JSON lines instead of text")
    log_payloads: bool = Field(
        False, description="never on by default: would log prompt and completion text at DEBUG"
    )

    @field_validator("api_keys", "admin_keys", mode="before")
    @classmethod
    def _split_keys(cls, v: Any) -> Any:
        return _split_keys(v)

    @field_validator("api_keys", "admin_keys")
    @classmethod
    def _valid_keys(cls, v: list[SecretStr]) -> list[SecretStr]:
        return _check_keys(v)

    @field_validator("forward_headers")
    @classmethod
    def _forward_headers(cls, v: list[str]) -> list[str]:
        from gateway.wire.headers import check_forwardable

        return [check_forwardable(name) for name in v]


class ScrapeConfig(_Strict):
    enabled: bool = Field(True, description="scrape each engine's /metrics and /health")
    interval_s: float = Field(
        1.0, gt=0.0, le=60.0, description="seconds between two scrapes of each engine's /metrics and /health"
    )
    timeout_s: float = Field(
        0.5, gt=0.0, le=60.0, description="one scrape's deadline; past it the scrape counts as failed"
    )
    stale_after_s: float = Field(5.0, gt=0.0, le=3600.0, description="older scraped data is 'unknown'")
    window_s: float = Field(10.0, gt=0.0, le=3600.0, description="window of the counter deltas")


class EngineConfig(_Strict):
    name: str = Field(description="unique engine name (used in metrics, headers, admin)")
    url: str = Field(description="base URL of the vLLM OpenAI server, e.g. http://10.0.0.5:8000")
    served_model_name: str = Field(description="the model name this engine expects in requests")
    api_key: SecretStr | None = Field(None, description="sent upstream as 'Authorization: Bearer'")
    method: SpecMethod | None = Field(
        None,
        description="the speculative engine's --speculative-config method (ngram, eagle3, ...); "
        "null on the plain engine",
    )
    k: int = Field(0, ge=0, le=64, description="num_speculative_tokens (0 on the plain engine)")
    prompt_lookup_min: int | None = Field(
        None,
        ge=1,
        le=64,
        description="n-gram methods: the engine's prompt_lookup_min, in tokens (null: 2, or 1 when only "
        "prompt_lookup_max is given)",
    )
    prompt_lookup_max: int | None = Field(
        None,
        ge=1,
        le=64,
        description="n-gram methods: the engine's prompt_lookup_max, in tokens (null: the larger of 5 and "
        "prompt_lookup_min)",
    )
    endpoint: str | None = Field(
        None,
        description="EPP mode: the ip:port the Envoy cluster knows this engine by (default: the url's "
        "host and port, a host name resolved when the EPP starts)",
    )

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"(\d{1,3}(\.\d{1,3}){3}|\[[0-9A-Fa-f:.]+\]):\d{1,5}", v):
            raise ValueError(f"must be ip:port (IPv6 in brackets), got {v!r}")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _check_name(v, "engine name")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        m = re.fullmatch(r"https?://[^/\s?#]+(/[^\s?#]*)?", v)
        if not m:
            raise ValueError(f"must be an http(s) base URL like http://host:port, got {v!r}")
        if v.endswith("/v1"):
            raise ValueError("give the server's base URL without the /v1 suffix")
        return v

    @field_validator("served_model_name")
    @classmethod
    def _served(cls, v: str) -> str:
        if not v or len(v) > 256 or any(c.isspace() for c in v):
            raise ValueError("must be a non-empty name without whitespace (≤256 characters)")
        return v

    @model_validator(mode="after")
    def _lookup_range(self) -> EngineConfig:
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is not None and hi is not None and lo > hi:
            raise ValueError("prompt_lookup_min must be ≤ prompt_lookup_max")
        return self

    def auth_headers(self) -> dict[str, str]:
        """The header that authenticates the gateway to this engine (none without a key;
        an empty key counts as none)."""
        if not self.api_key:
            return {}
        return {"Authorization": "Bearer " + self.api_key.get_secret_value()}


class PairConfig(_Strict):
    name: str | None = Field(
        None,
        description="the pair's name: its identity across config reloads (a reload that changes a "
        "named pair replaces it: the old one drains); default: the base engine's name",
    )
    device: str = Field("gpu0", description="engines of a pair share this device timeline")
    spec: EngineConfig | None = Field(
        None,
        description="the speculative engine; leave it out to run in front of the plain engine alone "
        "(every request goes to it, and the advisor says what speculation would buy)",
    )
    base: EngineConfig = Field(description="the plain engine (no speculation)")

    @model_validator(mode="after")
    def _roles(self) -> PairConfig:
        if self.base.method is not None or self.base.k != 0:
            raise ValueError("base engine is the plain one: it must not declare 'method' or 'k'")
        if self.spec is None:
            return self
        if self.spec.method is None:
            raise ValueError("spec engine must declare its speculative 'method' (e.g. ngram)")
        if self.spec.k < 1:
            raise ValueError("spec engine must declare k ≥ 1 (num_speculative_tokens)")
        if self.spec.method in PROMPT_LOOKUP_METHODS:
            if self.spec.prompt_lookup_min is None:
                self.spec.prompt_lookup_min = 2 if self.spec.prompt_lookup_max is None else 1
            if self.spec.prompt_lookup_max is None:
                self.spec.prompt_lookup_max = max(5, self.spec.prompt_lookup_min)
        return self

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return v if v is None else _check_name(v, "pair name")

    @property
    def engines(self) -> tuple[EngineConfig, ...]:
        return (self.base,) if self.spec is None else (self.spec, self.base)

    @property
    def key(self) -> str:
        """The pair's identity: its name, else its base engine's (engine names are unique)."""
        return self.name or self.base.name


class AdviceConfig(_Strict):
    """The n-gram proposer the advisor replays answers through where the model has no n-gram
    engine (a plain engine alone, or an EAGLE-3 or draft-model pair); a model with an n-gram
    engine is advised on that engine's own settings. vLLM's ``--speculative-config`` names."""

    k: int = Field(5, ge=1, le=64, description="num_speculative_tokens")
    prompt_lookup_min: int = Field(
        2, ge=1, le=64, description="shortest n-gram (tokens) the replayed proposer matches"
    )
    prompt_lookup_max: int = Field(5, ge=1, le=64, description="longest n-gram (tokens) it matches")
    suffix_cached_answers: int = Field(
        0,
        ge=0,
        le=10_000,
        description="earlier answers the suffix-decoding replay drafts from (0, the default: no suffix "
        "replay; 128 cost a 5-min soak about 40 MiB of peak RSS)",
    )

    @model_validator(mode="after")
    def _lookup_range(self) -> AdviceConfig:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min must be ≤ prompt_lookup_max")
        return self


class TimeoutsConfig(_Strict):
    connect_s: float = Field(2.0, gt=0.0, le=600.0, description="TCP connect to an engine")
    first_byte_s: float = Field(
        60.0,
        gt=0.0,
        le=3600.0,
        description="per attempt, until the engine's first stream event; a non-streamed answer only "
        "arrives whole, so it gets this plus max_tokens x nonstream_token_s (each capped by total_s). "
        "Past it the attempt moves to the sibling engine",
    )
    nonstream_token_s: float = Field(
        0.05,
        gt=0.0,
        le=60.0,
        description="slowest decode a non-streamed answer is allowed per requested token (max_tokens) "
        "before its attempt counts as stalled",
    )
    idle_s: float = Field(
        30.0, gt=0.0, le=3600.0, description="longest silence of the engine between stream events"
    )
    client_stall_s: float = Field(
        30.0,
        gt=0.0,
        le=3600.0,
        description="longest a stream waits for a client that does not read (its buffer full); then the "
        "client is disconnected and the engine request aborted - never counted against the engine",
    )
    total_s: float = Field(
        600.0, gt=0.0, le=86400.0, description="whole request, all attempts (a client-level cap)"
    )


class RetryConfig(_Strict):
    on_sibling: bool = Field(
        True, description="retry once on the pair's other engine when one fails before the first byte"
    )
    failures_to_unhealthy: int = Field(
        3, ge=1, le=1000, description="consecutive connect/5xx failures that mark an engine down"
    )
    cooldown_s: float = Field(5.0, ge=0.0, le=3600.0, description="how long a failed engine stays down")
    failure_rate_to_unhealthy: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="share of failed attempts within failure_window_s that marks an engine down "
        "(catches engines failing often, but not in a row)",
    )
    failure_window_s: float = Field(10.0, gt=0.0, le=3600.0, description="window of the failure rate")
    failure_rate_min_attempts: int = Field(
        10, ge=1, le=100_000, description="attempts in the window before the failure rate counts"
    )


class ModelConfig(_Strict):
    name: str = Field(description="the model name clients use")
    # before `pairs`, whose check reads it
    discovery: DiscoveryConfig | None = Field(
        None,
        description="find more pairs while serving: a headless Service's DNS records or the "
        "EndpointSlices of a Service (docs/discovery.md); they join and leave without a restart",
    )
    pairs: list[PairConfig] = Field(
        default_factory=list,
        description="the model's engine pairs; may be empty only with 'discovery' (pairs found live)",
    )
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig, description="deadlines of a request")
    retry: RetryConfig = Field(
        default_factory=RetryConfig, description="retries on the sibling engine and when an engine is down"
    )
    routing: RoutingConfig = Field(
        default_factory=RoutingConfig, description="the routing policy: which engine each request goes to"
    )
    advice: AdviceConfig = Field(
        default_factory=AdviceConfig,
        description="the n-gram proposer GET /admin/advice replays answers through",
    )
    max_concurrency: int | None = Field(
        None, ge=1, description="requests in flight for this model before 429 (none: only the server limit)"
    )
    api_keys: list[SecretStr] = Field(
        default_factory=list,
        description="keys that may use only this model (server.api_keys may use every model); "
        "when set, requests for this model need one of them or a server key",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _check_name(v, "model name")

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, v: Any) -> Any:
        return _split_keys(v)

    @field_validator("api_keys")
    @classmethod
    def _valid_keys(cls, v: list[SecretStr]) -> list[SecretStr]:
        return _check_keys(v)

    @field_validator("pairs")
    @classmethod
    def _some_pairs(cls, v: list[PairConfig], info: ValidationInfo) -> list[PairConfig]:
        if not v and info.data.get("discovery") is None:
            raise ValueError("needs at least 1 pair (or 'discovery', which finds them while serving)")
        keys = [p.key for p in v]
        dup = next((k for k in keys if keys.count(k) > 1), None)
        if dup is not None:
            raise ValueError(f"pair name {dup!r} appears twice (give each pair its own 'name')")
        return v


class PeersConfig(_Strict):
    """The optional peer channel between gateway replicas (gateway.peers)."""

    url: SecretStr | None = Field(
        None,
        description="Redis URL (redis://[:password@]host:6379/0, rediss:// for TLS) joining this "
        "gateway's replicas: they share requests in flight, outcomes and one leader's regime per "
        "model. Unset (the default): each replica decides alone, agreeing with the others through "
        "the engines' metrics",
    )
    channel: str = Field(
        "specgate",
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9._:-]+$",
        description="pub/sub channel and lease key prefix: one per set of replicas fronting the same engines",
    )
    replica_id: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9._:-]+$",
        description="this replica's name on the channel (default: host name, process id and a random suffix)",
    )
    lease_s: float = Field(
        3.0,
        ge=0.5,
        le=60.0,
        description="the leader's lease: a dead leader is replaced within it; renewed every third of it",
    )
    timeout_s: float = Field(1.0, gt=0.0, le=10.0, description="each Redis operation's timeout")
    queue: int = Field(
        10_000,
        ge=100,
        le=1_000_000,
        description="outgoing messages held while Redis is slow; beyond, the oldest are dropped (counted)",
    )

    @field_validator("url")
    @classmethod
    def _redis_url(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None:
            return v
        url = v.get_secret_value()
        if not url.startswith(("redis://", "rediss://", "unix:///")):
            raise ValueError(
                "peers.url must be redis://host[:port][/db], rediss://... or unix:///absolute/path"
            )
        return v


class GatewayConfig(_Strict):
    server: ServerConfig = Field(
        default_factory=ServerConfig, description="the HTTP listener, its limits, keys and logging"
    )
    peers: PeersConfig = Field(
        default_factory=PeersConfig, description="the optional channel between gateway replicas (Redis)"
    )
    scrape: ScrapeConfig = Field(
        default_factory=ScrapeConfig, description="how the engines' /metrics and /health are read"
    )
    models: list[ModelConfig] = Field(
        min_length=1, description="the models served, each on its engine pairs (at least one)"
    )
    telemetry: TelemetryConfig = Field(
        default_factory=TelemetryConfig,
        description="metrics, traces and the access log (tracing itself is switched on by OTEL_* variables)",
    )
    epp: EppConfig = Field(
        default_factory=EppConfig,
        description="serve as an Endpoint Picker for Envoy (ext_proc gRPC) beside the HTTP port",
    )
    fleet: FleetConfig = Field(
        default_factory=FleetConfig,
        description="pairs that join and leave while serving: drains, config reloads (docs/discovery.md)",
    )

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        seen_models: set[str] = set()
        seen_engines: set[str] = set()
        for m in self.models:
            if m.name in seen_models:
                raise ValueError(f"models: name {m.name!r} appears twice")
            seen_models.add(m.name)
            found = () if m.discovery is None else (m.discovery.spec is None,)
            if len({*(p.spec is None for p in m.pairs), *found}) > 1:
                raise ValueError(
                    f"models: {m.name!r} mixes pairs with and without a spec engine "
                    "(give every pair one, or none)"
                )
            for p in m.pairs:
                for e in p.engines:
                    if e.name in seen_engines:
                        raise ValueError(f"models: engine name {e.name!r} appears twice (names are global)")
                    seen_engines.add(e.name)
        return self

    @model_validator(mode="after")
    def _epp_guards_engine_keys(self) -> GatewayConfig:
        # An EPP answer carries the engine's Authorization header: only to a peer the EPP knows.
        keyed = [e.name for m in self.models for p in m.pairs for e in p.engines if e.api_key is not None]
        keyed += [
            f"{m.name}'s discovered engines"
            for m in self.models
            if m.discovery is not None
            and any(t is not None and t.api_key is not None for t in (m.discovery.spec, m.discovery.base))
        ]
        if self.epp.enabled and keyed and not self.epp.authenticates:
            raise ValueError(
                f"epp: engines {', '.join(keyed)} have api_key, and the EPP's answers carry it: set "
                "epp.auth_token (or epp.tls_client_ca) so that only Envoy can read them"
            )
        return self

    def model(self, name: str) -> ModelConfig | None:
        for m in self.models:
            if m.name == name:
                return m
        return None
