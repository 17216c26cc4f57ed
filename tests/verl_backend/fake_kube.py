"""A Kubernetes API server on 127.0.0.1 that speaks the few endpoints a RayJob client uses,
with bodies built from the `kubernetes` client's own models (V1Pod, V1PodList, V1Status).

    with FakeKube(statuses, log_lines) as kube:
        status = run_rayjob(kube.client(), manifest, settings)
    kube.created, kube.deleted, kube.calls   # what the client did: (group, resource, verb)
    kube.live.add(name)                      # a RayJob that already exists (a stale one)

RayJob lifecycle: after the create, each GET of the RayJob returns the next of `statuses`
(the last one repeats); the submitter pod (label job-name=<rayjob>) exists from the second
GET on and its log shows one more of `log_lines` per GET. `on_status(status, rayjob)` runs
before a status is served (a test uses it to write what the Ray job would write).
"""

from __future__ import annotations

import datetime
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes import client as k8s

RAYJOB = re.compile(r"^/apis/ray\.io/v1/namespaces/([^/]+)/rayjobs(?:/([^/]+))?$")
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)(/log)?)?$")
EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


class FakeKube:
    def __init__(
        self,
        statuses: list[dict[str, Any]],
        log_lines: list[str],
        on_status: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
    ) -> None:
        self.statuses, self.log_lines, self.on_status = statuses, log_lines, on_status
        self.created: dict[str, dict[str, Any]] = {}  # name -> the last manifest POSTed
        self.live: set[str] = set()  # RayJobs that exist now
        self.deleted: list[str] = []
        self.calls: set[tuple[str, str, str]] = set()  # (apiGroup, resource, verb)
        self.gets = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeKube:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def client(self) -> k8s.ApiClient:
        conf = k8s.Configuration(host=f"http://127.0.0.1:{self._server.server_port}")
        return k8s.ApiClient(conf)

    # ---- the API ----------------------------------------------------------------------
    def _serve(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple:
        if m := RAYJOB.match(path):
            return self._rayjob(method, m.group(1), m.group(2), body)
        if m := PODS.match(path):
            ns, pod, log = m.groups()
            if log:
                self.calls.add(("", "pods/log", "get"))
                shown = self.log_lines[: max(self.gets - 1, 0)]
                return 200, "text/plain", "".join(line + "\n" for line in shown)
            self.calls.add(("", "pods", "list" if pod is None else "get"))
            (selector,) = query.get("labelSelector", [""])
            job = selector.removeprefix("job-name=")
            pods = [self._submitter(ns, job)] if job in self.live and self.gets > 1 else []
            return self._model(200, k8s.V1PodList(items=pods))
        return self._status(404, f"no route {method} {path}")

    def _rayjob(self, method: str, ns: str, name: str | None, body: Any) -> tuple:
        verb = {"POST": "create", "GET": "get", "DELETE": "delete"}[method]
        self.calls.add(("ray.io", "rayjobs", verb if name or method != "GET" else "list"))
        if method == "POST":
            name = body["metadata"]["name"]
            if name in self.live:
                return self._status(409, f'rayjobs.ray.io "{name}" already exists')
            self.created[name] = body
            self.live.add(name)
            return 201, "application/json", json.dumps(body)
        if name not in self.live:
            return self._status(404, f'rayjobs.ray.io "{name}" not found')
        if method == "DELETE":
            self.live.discard(name)
            self.deleted.append(name)
            return self._model(200, k8s.V1Status(status="Success", code=200))
        self.gets += 1
        status = self.statuses[min(self.gets - 1, len(self.statuses) - 1)]
        if self.on_status:
            self.on_status(status, self.created[name])
        return 200, "application/json", json.dumps({**self.created[name], "status": status})

    def _submitter(self, ns: str, job: str) -> k8s.V1Pod:
        meta = k8s.V1ObjectMeta(
            name=f"{job}-x7k2p", namespace=ns, labels={"job-name": job}, creation_timestamp=EPOCH
        )
        return k8s.V1Pod(metadata=meta, status=k8s.V1PodStatus(phase="Running"))

    def _model(self, code: int, obj: Any) -> tuple:
        body = k8s.ApiClient().sanitize_for_serialization(obj)
        return code, "application/json", json.dumps(body)

    def _status(self, code: int, message: str) -> tuple:
        reason = {404: "NotFound", 409: "AlreadyExists"}.get(code, "BadRequest")
        status = k8s.V1Status(status="Failure", code=code, message=message, reason=reason)
        return self._model(code, status)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self) -> None:
                url = urlparse(self.path)
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size)) if size else None
                code, kind, text = fake._serve(self.command, url.path, parse_qs(url.query), body)
                data = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _reply

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
