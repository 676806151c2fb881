"""A new configuration applied while serving: SIGHUP, ``POST /admin/reload``, the file watch.

:func:`plan` compares the configuration serving with a new one and builds the *effective*
configuration: the new one's settings that apply live (:data:`LIVE_MODEL_FIELDS` of each
model, the ``fleet`` section), the old one's for everything else. What differs and was not
applied is listed (``restart_needed``): logged as a warning and shown in ``/admin/state``,
never silently ignored. A new configuration that does not load or validate is refused:
logged as an error, the old one keeps serving.

:class:`Reloader` serialises reloads, keeps the last outcome, and (``fleet.watch_config_s``)
watches the file: its mtime and size every interval, then a hash of its bytes (a touched,
unchanged file reloads nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from gateway.config.loader import ConfigError
from gateway.config.models import GatewayConfig, ModelConfig

log = logging.getLogger(__name__)

# Per model: read per request (timeouts, limits, keys) or applied through the registry
# (pairs, discovery). The rest (routing, retry, advice) is baked into the policy and the
# engines' runtimes when the gateway starts.
LIVE_MODEL_FIELDS = frozenset({"pairs", "discovery", "timeouts", "max_concurrency", "api_keys"})
LIVE_SECTIONS = frozenset({"fleet"})


@dataclass(frozen=True)
class ConfigSource:
    """How to read the configuration again (``load``: file, environment and flags, as at
    start), and the file to watch (None: nothing to watch)."""

    load: Callable[[], GatewayConfig]
    path: Path | None = None


@dataclass(frozen=True)
class Plan:
    effective: GatewayConfig
    applied: tuple[str, ...]  # dotted paths applied live
    restart_needed: tuple[str, ...]  # dotted paths that differ and wait for a restart


def _diff(old: Any, new: Any, path: str, out: list[str]) -> None:
    if isinstance(old, BaseModel) and isinstance(new, BaseModel) and type(old) is type(new):
        for name in type(old).model_fields:
            _diff(getattr(old, name), getattr(new, name), f"{path}.{name}" if path else name, out)
    elif old != new:
        out.append(path)


def diff(old: Any, new: Any, path: str = "") -> list[str]:
    """Dotted paths of the settings that differ (secrets compared, never shown)."""
    out: list[str] = []
    _diff(old, new, path, out)
    return out


def _model(old: ModelConfig, new: ModelConfig, applied: list[str], restart: list[str]) -> ModelConfig:
    at = f"models[{old.name}]"
    live = {}
    for name in type(old).model_fields:
        changed = diff(getattr(old, name), getattr(new, name), f"{at}.{name}")
        if name in LIVE_MODEL_FIELDS:
            live[name] = getattr(new, name)
            applied.extend(changed)
        else:
            restart.extend(changed)
    return old.model_copy(update=live)


def plan(old: GatewayConfig, new: GatewayConfig) -> Plan:
    """The effective configuration of a reload from ``old`` to ``new``. Raises
    :class:`ConfigError` when the combination does not validate."""
    applied: list[str] = []
    restart: list[str] = []
    news = {m.name: m for m in new.models}
    models = []
    for m in old.models:
        if m.name in news:
            models.append(_model(m, news[m.name], applied, restart))
        else:
            models.append(m)
            restart.append(f"models[{m.name}] (removed)")
    restart.extend(f"models[{n}] (added)" for n in news if old.model(n) is None)
    update: dict[str, Any] = {"models": models}
    for name in type(old).model_fields:
        if name == "models":
            continue
        changed = diff(getattr(old, name), getattr(new, name), name)
        if name in LIVE_SECTIONS:
            update[name] = getattr(new, name)
            applied.extend(changed)
        else:
            restart.extend(changed)
    merged = old.model_copy(update=update)
    try:  # the cross-section rules (unique engine names, the EPP's key guard) on the mix
        effective = GatewayConfig.model_validate(dict(merged))
    except ValidationError as exc:
        raise ConfigError(f"the new configuration cannot be applied live: {exc}") from None
    return Plan(effective, tuple(applied), tuple(restart))


@dataclass
class Outcome:
    """One reload's result, as ``/admin/state`` and ``POST /admin/reload`` show it."""

    trigger: str
    ok: bool
    at: float = field(default_factory=time.time)
    error: str | None = None
    applied: tuple[str, ...] = ()
    restart_needed: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "trigger": self.trigger,
            "ok": self.ok,
            "at": round(self.at, 3),
            "error": self.error,
            "applied": list(self.applied),
            "restart_needed": list(self.restart_needed),
        }


class Reloader:
    def __init__(
        self,
        source: ConfigSource,
        current: Callable[[], GatewayConfig],
        apply: Callable[[GatewayConfig], None],
    ) -> None:
        self.source = source
        self._current = current
        self._apply = apply
        self._lock = asyncio.Lock()
        self.last: Outcome | None = None
        self.restart_needed: tuple[str, ...] = ()  # since the start, as of the last reload
        self.listeners: list[Callable[[Outcome], None]] = []
        self._watch: asyncio.Task[None] | None = None
        self._seen: tuple[int, int] | None = None  # the watched file's (mtime_ns, size)
        self._digest: bytes | None = None  # and the hash of its bytes

    async def reload(self, trigger: str) -> Outcome:
        """Re-read the configuration and apply it; never raises."""
        async with self._lock:
            outcome = await self._reload(trigger)
            self.last = outcome
        for listener in list(self.listeners):
            with contextlib.suppress(Exception):
                listener(outcome)
        return outcome

    async def _reload(self, trigger: str) -> Outcome:
        try:
            new = await asyncio.to_thread(self.source.load)
            p = plan(self._current(), new)
        except ConfigError as exc:
            log.error(
                "config reload (%s) refused; the previous configuration keeps serving: %s", trigger, exc
            )
            return Outcome(trigger, False, error=str(exc))
        self._apply(p.effective)
        self.restart_needed = p.restart_needed
        if self._watch is not None and self._watch.done():
            self._watch = None
        await self.start()  # the watch may have been turned on
        log.info("config reload (%s): %d change(s) applied", trigger, len(p.applied))
        if p.restart_needed:
            log.warning(
                "config reload (%s): changes that take effect only after a restart: %s",
                trigger,
                ", ".join(p.restart_needed),
            )
        return Outcome(trigger, True, applied=p.applied, restart_needed=p.restart_needed)

    # -- the file watch ---------------------------------------------------------------------
    async def start(self) -> None:
        """Watch the file when ``fleet.watch_config_s`` is set: its state now is the baseline
        (a change before the gateway started is not seen: SIGHUP applies it)."""
        if self.source.path is not None and self._current().fleet.watch_config_s > 0 and self._watch is None:
            await self.check_file()
            self._watch = asyncio.get_running_loop().create_task(self._watching(), name="config watch")

    @property
    def watching(self) -> bool:
        return self._watch is not None and not self._watch.done()

    async def stop(self) -> None:
        task, self._watch = self._watch, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watching(self) -> None:
        while (interval := self._current().fleet.watch_config_s) > 0:  # a reload may turn it off
            await asyncio.sleep(interval)
            if await self.check_file():
                await self.reload("file watch")

    async def check_file(self) -> bool:
        """Look at the watched file: True when its bytes changed since the last look."""
        path = self.source.path
        if path is None:
            return False
        try:
            seen, digest = await asyncio.to_thread(_fingerprint, path, self._seen, self._digest)
        except OSError as exc:
            log.warning("config watch: cannot read %s: %s", path, exc)
            return False
        first = self._seen is None
        changed = not first and digest != self._digest
        self._seen, self._digest = seen, digest
        return changed


def _fingerprint(
    path: Path, seen: tuple[int, int] | None, digest: bytes | None
) -> tuple[tuple[int, int], bytes]:
    st = path.stat()
    now = (st.st_mtime_ns, st.st_size)
    if now == seen and digest is not None:
        return now, digest
    return now, hashlib.sha256(path.read_bytes()).digest()
