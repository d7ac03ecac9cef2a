"""A client of the SGLang Model Gateway's worker API (PyPI `sglang-router`, read on 0.3.2).

What 0.3.2 answers (run on loopback in front of engine stand-ins, tests/traffic/test_traffic_gateway.py):
- `POST /workers {"url", "api_key"?}` -> 202 `{"status": "accepted", "worker_id", "url", "location"}`;
  a background workflow checks the worker (its /server_info, /get_model_info) and registers
  it, so the worker appears in `GET /workers` only later;
- `GET /workers` -> `{"workers": [{"id", "url", "is_healthy", "load", "model_id", ...}], "total"}`;
- `GET /workers/{id}` -> the worker, or 404 `{"code": "WORKER_NOT_FOUND"}`;
- `DELETE /workers/{id}` -> 202 (removal queued; the worker leaves `GET /workers` shortly after);
- `GET /get_loads` -> `{"workers": [{"worker": URL, "load": N}]}` (-1 when the engine has no /get_load);
- `GET /readiness` -> 200 `{"status": "ready", "healthy_workers", "total_workers"}` or 503;
- the control plane (the /workers routes) needs `Authorization: Bearer KEY` when the gateway runs
  with `--control-plane-api-keys id:name:admin:KEY`; 401 otherwise. The old `/add_worker` is 404.

The admin key is a secret: it is sent in a header only, and no message of this module
contains it (nor a URL's user:password part). Errors are one line (`GatewayError`).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import quote, urlsplit

from k26ops import interrupt


class GatewayError(Exception):
    """The gateway could not be reached or refused a request: one line, no secret."""


def normal_url(url: str) -> str:
    """A worker URL as the gateway compares it: scheme://host:port, no trailing slash."""
    return str(url).strip().rstrip("/")


def shown_url(url: str) -> str:
    """`url` without a user:password part, for messages."""
    p = urlsplit(str(url))
    host = p.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{p.scheme}://{host}" + (f":{p.port}" if p.port else "") + (p.path.rstrip("/") or "")


def check_url(url, what: str = "model_gateway") -> str:
    """`url` if it is an http(s) URL with a host, else ValueError naming it (without credentials)."""
    text = str(url).strip()
    try:
        p = urlsplit(text)
        p.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise ValueError(f"{what}: {shown_url(text)!r} is not a URL") from None
    if p.scheme not in ("http", "https") or not p.hostname:
        raise ValueError(f"{what}: {shown_url(text)!r} is not an http(s) URL with a host")
    return text.rstrip("/")


@dataclass
class Worker:
    """One worker as `GET /workers` lists it."""

    id: str
    url: str
    healthy: bool
    load: int | None = None
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, d: dict) -> "Worker":
        return cls(
            id=str(d.get("id") or ""),
            url=normal_url(d.get("url") or ""),
            healthy=bool(d.get("is_healthy")),
            load=d.get("load"),
            raw=d,
        )


class Gateway:
    """One SGLang Model Gateway at `url` (its HTTP port), with its admin key if it has one."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 10.0):
        self.url = check_url(url)
        self._key = api_key or None
        self.timeout = timeout
        p = urlsplit(self.url)
        self._tls = p.scheme == "https"
        self._host, self._port = p.hostname, p.port or (443 if self._tls else 80)
        self._base = p.path.rstrip("/")

    @property
    def name(self) -> str:
        return shown_url(self.url)

    def __repr__(self) -> str:  # never the key
        return f"Gateway({self.name})"

    # ---------------------------------------------------------------- HTTP
    def request(
        self, method: str, path: str, body: dict | None = None, timeout: float | None = None
    ) -> tuple[int, object]:
        """(status, decoded JSON or text). GatewayError when the gateway does not answer."""
        cls = http.client.HTTPSConnection if self._tls else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=timeout or self.timeout)
        headers = {"Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, self._base + path, body=data, headers=headers)
            res = conn.getresponse()
            raw = res.read()
            status = res.status
        except (OSError, http.client.HTTPException) as exc:
            raise GatewayError(
                f"gateway {self.name}: {method} {path}: {type(exc).__name__}: {exc}".replace(
                    self._key or "\0", "<redacted>"
                )
            ) from None
        finally:
            conn.close()
        text = raw.decode("utf-8", "replace")
        try:
            return status, json.loads(text) if text.strip() else None
        except ValueError:
            return status, text

    def _ok(self, method: str, path: str, body: dict | None = None, want=(200,)) -> object:
        status, out = self.request(method, path, body)
        if status == 401:
            raise GatewayError(
                f"gateway {self.name}: {method} {path}: 401 Unauthorized (model_gateway_api_key: "
                f"{'wrong' if self._key else 'none given'}; the gateway's --control-plane-api-keys "
                "admin key is needed)"
            )
        if status not in want:
            detail = out.get("error") or out.get("message") if isinstance(out, dict) else out
            if isinstance(detail, dict):
                detail = detail.get("message") or json.dumps(detail)
            raise GatewayError(f"gateway {self.name}: {method} {path}: HTTP {status}: {str(detail or '')[:200]}")
        return out

    # ---------------------------------------------------------------- the worker API
    def workers(self) -> list[Worker]:
        out = self._ok("GET", "/workers")
        items = out.get("workers") if isinstance(out, dict) else None
        if not isinstance(items, list):
            raise GatewayError(f"gateway {self.name}: GET /workers: not a worker list: {str(out)[:120]}")
        return [Worker.of(w) for w in items if isinstance(w, dict)]

    def worker(self, worker_id: str) -> Worker | None:
        """The worker by id; None when the gateway does not know it (404)."""
        status, out = self.request("GET", f"/workers/{quote(worker_id, safe='')}")
        if status == 404:
            return None
        if status != 200 or not isinstance(out, dict):
            raise GatewayError(f"gateway {self.name}: GET /workers/{worker_id}: HTTP {status}")
        return Worker.of(out)

    def find(self, url: str) -> Worker | None:
        """The worker registered for engine `url`, if any."""
        url = normal_url(url)
        return next((w for w in self.workers() if w.url == url), None)

    def add(self, url: str, api_key: str | None = None) -> tuple[str, str]:
        """POST /workers: (worker_id, location). The worker is registered in the background."""
        body = {"url": normal_url(url)}
        if api_key:
            body["api_key"] = api_key  # the engine's own --api-key, for the gateway's requests to it
        out = self._ok("POST", "/workers", body, want=(200, 201, 202))
        if not isinstance(out, dict):
            out = {}
        return str(out.get("worker_id") or ""), str(out.get("location") or "")

    def remove(self, worker_id: str) -> bool:
        """DELETE /workers/{id}: True when queued, False when the gateway did not know it."""
        status, _out = self.request("DELETE", f"/workers/{quote(worker_id, safe='')}")
        if status == 404:
            return False
        if status == 401:
            self._ok("DELETE", f"/workers/{worker_id}")  # raises the 401 line
        if status not in (200, 202, 204):
            raise GatewayError(f"gateway {self.name}: DELETE /workers/{worker_id}: HTTP {status}")
        return True

    def loads(self) -> dict[str, int]:
        """{worker url: load} from /get_loads (-1: the engine did not say)."""
        out = self._ok("GET", "/get_loads")
        items = out.get("workers") if isinstance(out, dict) else None
        return {normal_url(w.get("worker") or ""): w.get("load") for w in items or [] if isinstance(w, dict)}

    def readiness(self) -> dict:
        """/readiness: {"ready": bool, "healthy_workers", "total_workers"} (503 is an answer, not an error)."""
        status, out = self.request("GET", "/readiness")
        d = out if isinstance(out, dict) else {}
        return {
            "ready": status == 200,
            "healthy_workers": d.get("healthy_workers"),
            "total_workers": d.get("total_workers"),
            "status": d.get("status") or d.get("reason"),
        }

    # ---------------------------------------------------------------- waits
    def wait_gone(
        self, worker_id: str, timeout: float = 30.0, interval: float = 0.2, interruptible: bool = False
    ) -> bool:
        """Until the removal of `worker_id` is done (404); False on timeout (or interrupt, if interruptible)."""
        end = time.monotonic() + timeout
        while self.worker(worker_id) is not None:
            if time.monotonic() >= end or (interruptible and interrupt.requested.is_set()):
                return False
            time.sleep(interval)
        return True

    def wait_healthy(
        self,
        url: str,
        timeout: float,
        interval: float = 0.5,
        interruptible: bool = False,
        on_wait: Callable[[float], None] = lambda s: None,
    ) -> Worker | None:
        """Until the worker for `url` is listed and healthy; None on timeout (or interrupt, if interruptible)."""
        t0 = time.monotonic()
        while True:
            w = self.find(url)
            if w is not None and w.healthy:
                return w
            el = time.monotonic() - t0
            if el >= timeout or (interruptible and interrupt.requested.is_set()):
                return None
            on_wait(el)
            time.sleep(interval)


class Watch:
    """A run's watch on its gateways: GET /workers every `interval` s in a thread, counting the
    windows in which a gateway had zero healthy workers (what a rollout must never cause)."""

    def __init__(self, gateways: list[Gateway], interval: float = 1.0):
        self.gateways, self.interval = gateways, interval
        self.zero_windows: dict[str, int] = {g.name: 0 for g in gateways}
        self.min_healthy: dict[str, int | None] = {g.name: None for g in gateways}
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gateway-watch", daemon=True)

    def _run(self) -> None:
        zero = {g.name: False for g in self.gateways}
        while True:
            for g in self.gateways:
                try:
                    n = sum(1 for w in g.workers() if w.healthy)
                except GatewayError as exc:
                    self.errors[g.name] = str(exc)
                    continue
                m = self.min_healthy[g.name]
                self.min_healthy[g.name] = n if m is None else min(m, n)
                if n == 0 and not zero[g.name]:
                    self.zero_windows[g.name] += 1
                zero[g.name] = n == 0
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> "Watch":
        if self.gateways:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def report(self) -> dict:
        """{"zero_worker_windows": N, "gateways": {name: {"min_healthy", "zero_worker_windows", "error"?}}}."""
        return {
            "zero_worker_windows": sum(self.zero_windows.values()),
            "gateways": {
                n: {
                    "min_healthy": self.min_healthy[n],
                    "zero_worker_windows": self.zero_windows[n],
                    **({"error": self.errors[n]} if n in self.errors else {}),
                }
                for n in self.zero_windows
            },
        }
