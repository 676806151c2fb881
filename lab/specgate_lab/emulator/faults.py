"""Fault knobs of an emulated engine (CLI flags, and ``POST /_emulator/faults`` at run time).

``startup_delay_s``        the port opens only after this many seconds (CLI only)
``crash_after_requests``   the engine dies when the (N+1)-th completion request arrives:
                           every open connection is cut and the port closes
``crash_mid_stream``       ... and that request first streams a few chunks, then the cut
``hang``                   ``accept``: completion requests are accepted and never answered;
                           ``mid_stream``: streams stop after a few chunks, the connection
                           stays open
``metrics_delay_s``        ``/metrics`` answers this many (wall) seconds late
``garbage_metrics``        ``/metrics`` answers text that is not the Prometheus format
``error_rate``             this share of completion requests gets an HTTP 500
``disable_log_stats``      no ``vllm:*`` families on ``/metrics`` (vLLM's flag; CLI only)
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Faults(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    startup_delay_s: float = Field(0.0, ge=0.0, le=3600.0)
    crash_after_requests: int | None = Field(None, ge=0)
    crash_mid_stream: bool = False
    hang: Literal["none", "accept", "mid_stream"] = "none"
    metrics_delay_s: float = Field(0.0, ge=0.0, le=600.0)
    garbage_metrics: bool = False
    error_rate: float = Field(0.0, ge=0.0, le=1.0)

    #: chunks a ``mid_stream`` crash or hang lets through first
    mid_stream_chunks: int = Field(3, ge=0, le=10_000)
