"""The admin listener: `/metrics` for Prometheus and `/healthz` for probes, apart from client traffic.

aiohttp is fine here (DESIGN.md: it is the right tool off the forwarding path); it runs on the
proxy's event loop and serves the proxy's own registry.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from replayproxy.errors import CannotListen
from replayproxy.proxy.metrics import ProxyMetrics

METRICS = web.AppKey("metrics", ProxyMetrics)
HEALTHY: web.AppKey[Callable[[], bool]] = web.AppKey("healthy")
RECORDING: web.AppKey[Callable[[], str]] = web.AppKey("recording")  # why recording fails, or ""


def make_admin_app(
    metrics: ProxyMetrics, healthy: Callable[[], bool], recording: Callable[[], str] = lambda: ""
) -> web.Application:
    app = web.Application()
    app[METRICS] = metrics
    app[HEALTHY] = healthy
    app[RECORDING] = recording
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    return app


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _healthz(request: web.Request) -> web.Response:
    """200 while accepting traffic, even while recording fails (live traffic never pays for it), and
    503 once draining, so load balancers stop sending; the body says both states."""
    failing = request.app[RECORDING]()
    body = {
        "status": "ok" if request.app[HEALTHY]() else "draining",
        "recording": f"failing ({failing})" if failing else "ok",
    }
    return web.json_response(body, status=200 if body["status"] == "ok" else 503)


async def start_admin(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve `app`; returns the runner (for cleanup) and the bound port."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise CannotListen(e.errno, f"admin listener: {e.strerror or e}") from e
    return runner, runner.addresses[0][1]
