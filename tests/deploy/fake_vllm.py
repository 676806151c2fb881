"""A stand-in for the `vllm` command line, used to test the pair supervisor offline.

`python fake_vllm.py serve MODEL --port P [...]` answers GET /health on 127.0.0.1:P and
records what happens to it as JSON lines in $FAKE_VLLM_LOG. Its role is "spec" when it
was given --speculative-config, else "base". Behaviour knobs (environment):

* FAKE_VLLM_<ROLE>_HEALTH_DELAY_S: answer /health with 503 for this long first;
* FAKE_VLLM_<ROLE>_EXIT=<delay_s>:<code>: exit on its own after delay_s with code;
* FAKE_VLLM_<ROLE>_IGNORE_TERM=1: ignore SIGTERM (the supervisor must SIGKILL it);
* FAKE_VLLM_<ROLE>_CORE=1: start a worker process, like vLLM's engine core, that lives
  on when this server is killed (recorded as event "core" with its pid).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    argv = sys.argv[1:]
    role = "spec" if "--speculative-config" in argv else "base"
    port = int(argv[argv.index("--port") + 1])
    log_path = os.environ["FAKE_VLLM_LOG"]
    started = time.monotonic()
    health_delay = float(os.environ.get(f"FAKE_VLLM_{role.upper()}_HEALTH_DELAY_S", "0"))

    def record(event: str, **extra: object) -> None:
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"role": role, "event": event, "pid": os.getpid(), **extra}) + "\n")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/health" and time.monotonic() - started >= health_delay
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:  # /v1/completions, just enough for pair-smoke.sh
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            body = json.dumps({"usage": {"completion_tokens": 128}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    record("started", argv=argv)

    def on_term(signum: int, _frame: object) -> None:
        record("signal", signal=signum)
        if os.environ.get(f"FAKE_VLLM_{role.upper()}_IGNORE_TERM") != "1":
            os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    if os.environ.get(f"FAKE_VLLM_{role.upper()}_CORE") == "1":
        core = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
        record("core", core_pid=core.pid)
    exit_spec = os.environ.get(f"FAKE_VLLM_{role.upper()}_EXIT")
    if exit_spec:
        delay, code = exit_spec.split(":")

        def exit_later() -> None:
            time.sleep(float(delay))
            record("exit", code=int(code))
            os._exit(int(code))

        threading.Thread(target=exit_later, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
