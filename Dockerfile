# replayproxy: sidecar recorder, replayer and reports in one small image.
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY replayproxy ./replayproxy
# The only unpinned name is this source tree itself; its dependencies are bounded in pyproject.toml.
# hadolint ignore=DL3013
# With the report extra (matplotlib), so `report --html` and `demo` work inside the image too, and
# the storage extra (fsspec, s3fs), so sidecars upload and replay pods read s3:// URLs.
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels ".[report,storage]"

FROM python:3.12-slim
RUN useradd --create-home --uid 10001 replayproxy \
    && mkdir -p /traces \
    && chown replayproxy:replayproxy /traces
COPY --from=build /wheels /wheels
# hadolint ignore=DL3013
RUN python -m pip install --no-cache-dir --no-index --find-links /wheels "replayproxy[report,storage]" \
    && rm -rf /wheels
USER 10001
WORKDIR /home/replayproxy
VOLUME ["/traces"]
EXPOSE 8080 9464
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=2).status != 200)"]
ENTRYPOINT ["replayproxy"]
CMD ["proxy", "--upstream", "http://127.0.0.1:8000", "--listen", "0.0.0.0:8080", "--trace-dir", "/traces", "--admin-listen", "0.0.0.0:9464"]
