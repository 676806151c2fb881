"""The ``fleet:`` section and a model's ``discovery:``: pairs that join and leave while serving.

A model's pairs are its static ``pairs`` plus, with ``discovery``, the pairs a source finds:
a headless Service's DNS records (``kind: dns``) or the EndpointSlices of a Service through
the Kubernetes API (``kind: kubernetes``). The pairing rule is the one of
``deploy/k8s/engines/*``: **one pod is one pair** (both engines on its GPU), its speculative
engine on ``spec.port`` and its plain engine on ``base.port`` of the pod's address. The
discovered pair of address ``A`` is named ``<model>-<A>`` and its engines
``<model>-<A>-spec`` / ``-base`` (a pod restarted at a new address is a new pair: new
engine, new cache, new counters). docs/discovery.md has the whole story.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from gateway.physics.methods import SpecMethod


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class FleetConfig(_Strict):
    """How pairs leave, and whether the configuration file is watched."""

    drain_timeout_s: float = Field(
        600.0,
        gt=0.0,
        le=86400.0,
        description="seconds a leaving pair waits for its requests before its scrapers stop and it is "
        "gone; requests still on it then finish anyway (their connections close when they end). "
        "600: the default timeouts.total_s, which no request outlives",
    )
    drain_poll_s: float = Field(
        0.25,
        gt=0.0,
        le=60.0,
        description="seconds between two looks at a leaving pair's requests in flight; a quarter second "
        "frees a pair promptly for ~4 cheap checks a second while it drains",
    )
    watch_config_s: float = Field(
        0.0,
        ge=0.0,
        le=3600.0,
        description="seconds between two looks at the configuration file (mtime, then a hash of its "
        "bytes); a change is applied as SIGHUP would. 0 (the default): not watched (SIGHUP and POST "
        "/admin/reload still reload); a mounted ConfigMap changes within ~60 s, so 5-10 s is plenty",
    )


class EngineTemplate(_Strict):
    """One role's engine on every discovered pair pod."""

    port: int = Field(
        ge=1, le=65535, description="the engine's TCP port on the pod (8001/8002 in deploy/k8s)"
    )
    port_name: str | None = Field(
        None,
        description="kubernetes: take the port the EndpointSlice names so (e.g. 'spec'), else ``port``",
    )
    scheme: Literal["http", "https"] = Field("http", description="the engine's URL scheme")
    served_model_name: str = Field(
        min_length=1, max_length=256, description="the model name the engine expects"
    )
    api_key: SecretStr | None = Field(None, description="sent upstream as 'Authorization: Bearer'")
    method: SpecMethod | None = Field(None, description="speculative engine: its --speculative-config method")
    k: int = Field(0, ge=0, le=64, description="num_speculative_tokens")
    prompt_lookup_min: int | None = Field(
        None, ge=1, le=64, description="n-gram methods: prompt_lookup_min, in tokens (as a pair's engine)"
    )
    prompt_lookup_max: int | None = Field(
        None, ge=1, le=64, description="n-gram methods: prompt_lookup_max, in tokens (as a pair's engine)"
    )


class DiscoveryConfig(_Strict):
    """Where a model's pair pods are found, and how each pod's engines are reached."""

    kind: Literal["dns", "kubernetes"] = Field(
        description="dns: resolve ``host``'s A/AAAA records every ``interval_s``; kubernetes: watch "
        "the EndpointSlices of ``service`` (or ``label_selector``) in ``namespace``"
    )
    host: str | None = Field(
        None,
        description="dns: the headless Service's name, e.g. qwen3-8b-pair.specgate.svc.cluster.local "
        "(each address it resolves to is one pair pod)",
    )
    family: Literal["ipv4", "ipv6", "any"] = Field(
        "ipv4",
        description="which addresses are pods: a dual-stack Service gives each pod an IPv4 and an IPv6 "
        "address, and taking both would count every pair twice (set ipv6 on an IPv6-only cluster)",
    )
    interval_s: float = Field(
        10.0,
        gt=0.0,
        le=3600.0,
        description="dns: seconds between two resolutions (kubernetes: between two attempts after the "
        "watch broke). 10: a new pod serves within ~10 s plus a health check, at one query per 10 s",
    )
    namespace: str | None = Field(
        None, description="kubernetes: the Service's namespace (default: the gateway pod's own)"
    )
    service: str | None = Field(
        None, description="kubernetes: the Service whose EndpointSlices list the pair pods"
    )
    label_selector: str | None = Field(
        None,
        description="kubernetes: EndpointSlices matching this selector instead (default: "
        "kubernetes.io/service-name=<service>)",
    )
    api_server: str | None = Field(
        None,
        description="kubernetes: API server URL (default: in-cluster, from KUBERNETES_SERVICE_HOST and "
        "the mounted service-account token and CA)",
    )
    spec: EngineTemplate | None = Field(
        None, description="the speculative engine of each pod (none: plain only)"
    )
    base: EngineTemplate = Field(description="the plain engine of each pod")
    device_from_pod: bool = Field(
        True, description="kubernetes: name the pair's device after its pod (else after its address)"
    )

    @model_validator(mode="after")
    def _check(self) -> DiscoveryConfig:
        if self.kind == "dns" and not self.host:
            raise ValueError("discovery kind dns needs 'host' (the headless Service's DNS name)")
        if self.kind == "kubernetes" and not (self.service or self.label_selector):
            raise ValueError("discovery kind kubernetes needs 'service' or 'label_selector'")
        if self.base.method is not None or self.base.k:
            raise ValueError("discovery.base is the plain engine: no 'method' or 'k'")
        if self.spec is not None and (self.spec.method is None or self.spec.k < 1):
            raise ValueError("discovery.spec must declare its speculative 'method' and k >= 1")
        return self

    @property
    def selector(self) -> str:
        return self.label_selector or f"kubernetes.io/service-name={self.service}"


def host_of(address: str) -> str:
    """A literal address as a URL host (IPv6 in brackets)."""
    return f"[{address}]" if isinstance(ipaddress.ip_address(address), ipaddress.IPv6Address) else address
