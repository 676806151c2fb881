"""Discovery from the Kubernetes API: the EndpointSlices of a Service, listed then watched.

With ``kubernetes_asyncio`` (the optional extra ``specgate[k8s]``): list the slices that
match the selector (``kubernetes.io/service-name=<service>`` by default), declare their
pods, then watch from the list's ``resourceVersion`` (``ADDED`` / ``MODIFIED`` /
``DELETED``), declaring again after each event. The watch ends every
:data:`WATCH_TIMEOUT_S` (the API server's own timeout) and after any error (a ``410 Gone``
included): the source lists afresh after ``interval_s``, keeping the last pairs meanwhile.

Each endpoint of a slice is one pair pod (:mod:`gateway.fleet.sources`): its first
address, its pod (``targetRef.name``) naming the pair's device, the slice's ports named
``spec.port_name`` / ``base.port_name`` when set. An endpoint whose ``conditions.terminating``
is true is left out, so its pair drains as the pod shuts down. Not-ready endpoints count
(as the Service's ``publishNotReadyAddresses``): the gateway's own health check decides
when a pair takes requests. RBAC: get/list/watch on ``endpointslices`` in the namespace
(``deploy/k8s/components/discovery``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.config.discovery import DiscoveryConfig, EngineTemplate
from gateway.fleet.found import Declare, Endpoint, stamp

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300  # seconds the API server keeps one watch open (then the source relists)
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def endpoints_of(slices: Mapping[str, Mapping[str, Any]], cfg: DiscoveryConfig) -> list[Endpoint]:
    """The pair pods of the slices (raw JSON objects), by the rule above."""
    out: dict[str, Endpoint] = {}
    for sl in slices.values():
        ports = {p.get("name") or "": p.get("port") for p in sl.get("ports") or [] if isinstance(p, dict)}
        spec_port = _port(cfg.spec, ports)
        base_port = _port(cfg.base, ports)
        for ep in sl.get("endpoints") or []:
            addrs = ep.get("addresses") or []
            if not addrs or (ep.get("conditions") or {}).get("terminating") is True:
                continue
            ref = ep.get("targetRef") or {}
            pod = ref.get("name") if isinstance(ref.get("name"), str) else ep.get("hostname")
            out[addrs[0]] = Endpoint(str(addrs[0]), pod, spec_port, base_port)
    return [out[a] for a in sorted(out)]


def _port(t: EngineTemplate | None, ports: Mapping[str, Any]) -> int | None:
    if t is None or t.port_name is None:
        return None
    p = ports.get(t.port_name)
    return p if isinstance(p, int) else None


class KubernetesSource:
    def __init__(self, model: str, cfg: DiscoveryConfig, declare: Declare) -> None:
        self.model = model
        self.cfg = cfg
        self._declare = declare
        self.slices: dict[str, dict[str, Any]] = {}
        self.namespace = cfg.namespace or ""  # "": the pod's own, read when the source runs
        self.status: dict[str, object] = {
            "namespace": self.namespace,
            "selector": cfg.selector,
            "pods": 0,
            "last_event": None,
            "error": None,
            "lists": 0,
        }
        self.listed = asyncio.Event()  # set after each successful list (tests wait on it)

    async def run(self) -> None:
        if not self.namespace:
            self.namespace = await asyncio.to_thread(_own_namespace)
            self.status["namespace"] = self.namespace
        while True:
            try:
                await self._list_and_watch()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an API error, a broken connection: relist later
                error = f"{type(exc).__name__}: {str(exc)[:200]}"
                if self.status.get("error") != error:
                    log.warning(
                        "discovery %s: EndpointSlice watch failed (keeping the last pairs): %s",
                        self.model,
                        error,
                    )
                self.status["error"] = error
            await asyncio.sleep(self.cfg.interval_s)

    async def _list_and_watch(self) -> None:
        try:
            from kubernetes_asyncio import client, watch
        except ImportError:
            raise RuntimeError(
                "discovery kind kubernetes needs kubernetes_asyncio: pip install 'specgate[k8s]'"
            ) from None
        async with client.ApiClient(await self._configuration()) as api_client:
            api = client.DiscoveryV1Api(api_client)
            resp: Any = await api.list_namespaced_endpoint_slice(  # raw: _preload_content=False
                self.namespace, label_selector=self.cfg.selector, _preload_content=False
            )
            raw = await resp.read()
            if resp.status != 200:  # never read an error as "no pods": that would drain the fleet
                raise RuntimeError(f"listing EndpointSlices: HTTP {resp.status}: {raw[:200]!r}")
            listed = json.loads(raw)
            self.slices = {s["metadata"]["name"]: s for s in listed.get("items") or []}
            self.status["lists"] = int(str(self.status["lists"])) + 1
            self.status["error"] = None
            self._publish()
            self.listed.set()
            rv = (listed.get("metadata") or {}).get("resourceVersion")
            async with watch.Watch() as w:
                stream = w.stream(
                    api.list_namespaced_endpoint_slice,
                    self.namespace,
                    label_selector=self.cfg.selector,
                    resource_version=rv,
                    timeout_seconds=WATCH_TIMEOUT_S,
                )
                async for event in stream:
                    self._apply(str(event["type"]), event["raw_object"])

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not isinstance(name, str):
            return
        if kind in ("ADDED", "MODIFIED"):
            self.slices[name] = obj
        elif kind == "DELETED":
            self.slices.pop(name, None)
        else:
            return
        self.status["last_event"] = stamp()
        self._publish()

    def _publish(self) -> None:
        eps = endpoints_of(self.slices, self.cfg)
        self.status["pods"] = len(eps)
        self._declare(eps)

    async def _configuration(self) -> Any:
        from kubernetes_asyncio import client, config

        c = client.Configuration()
        if self.cfg.api_server is not None:
            c.host = self.cfg.api_server
            token = SA_DIR / "token"
            if await asyncio.to_thread(token.is_file):
                c.api_key = {"authorization": "Bearer " + (await asyncio.to_thread(token.read_text)).strip()}
        else:
            await asyncio.to_thread(config.load_incluster_config, client_configuration=c)
        return c


def _own_namespace() -> str:
    try:
        return (SA_DIR / "namespace").read_text().strip() or "default"
    except OSError:
        return "default"
