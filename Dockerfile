# syntax=docker/dockerfile:1
#
# The offload gateway image: `offload-gateway` from mqtt-offload[gateway] on slim Python 3.11,
# running as uid/gid 10001 with nothing writable but /tmp (the Helm chart mounts an emptyDir
# there and sets readOnlyRootFilesystem).
#
#   docker build -t mqtt-offload-gateway:0.1.0 .
#   docker run --rm -p 8080:8080 -e OFFLOAD_STORAGE_URL=... mqtt-offload-gateway:0.1.0
#
# Dependencies are pinned to exact versions in constraints.txt below: the closure of the
# `gateway` and `otel` extras (plus the build backend), as tested. With `otel`, the gateway
# exports traces once OTEL_EXPORTER_OTLP_ENDPOINT is set (docs/tracing.md); unset, it
# imports nothing of it. The project itself is then installed with --no-index, so a
# dependency added to pyproject.toml but missing from the pins fails the build instead of
# being fetched unpinned. To refresh the pins, install `.[gateway,otel]` into
# a clean python:3.11-slim container and paste its `pip freeze` (without mqtt-offload itself).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

COPY <<'EOF' /src/constraints.txt
annotated-doc==0.0.7
annotated-types==0.7.0
anyio==4.16.0
argon2-cffi==25.1.0
argon2-cffi-bindings==26.2.0
asn1crypto==1.5.1
backports.zstd==1.8.0
certifi==2026.5.20
cffi==2.0.0
charset-normalizer==3.5.3
click==8.4.0
cryptography==50.0.2
dnspython==2.9.2
fastapi==0.165.0
fastapi-offline==1.7.7
google-crc32c==1.9.0
googleapis-common-protos==1.76.0
h11==0.16.0
httpcore==1.0.9
httptools==0.9.0
httpx==0.28.1
idna==3.13
minio==7.2.20
opentelemetry-api==1.45.2
opentelemetry-exporter-http-transport==0.66b2
opentelemetry-exporter-otlp-common==0.66b2
opentelemetry-exporter-otlp-proto-common==1.45.2
opentelemetry-exporter-otlp-proto-http==1.45.2
opentelemetry-proto==1.45.2
opentelemetry-sdk==1.45.2
opentelemetry-semantic-conventions==0.66b2
paho-mqtt==2.2.0
prometheus-client==0.26.0
protobuf==7.36.2
pycparser==3.0
pycryptodome==4.4.0
pydantic==2.13.4
pydantic-core==2.46.4
pydantic-settings==2.14.1
PyJWT==2.15.1
pymongo==4.20.0
python-dotenv==1.2.2
pyyaml==6.0.3
requests==2.34.2
scramp==1.5.0
setuptools==80.9.0
starlette==1.10.0
typing-extensions==4.16.0
typing-inspection==0.4.2
urllib3==2.7.0
uvicorn==0.54.0
uvloop==0.23.0
watchfiles==1.3.0
websockets==17.4
EOF

# Dependencies in their own layer, reused while only the project's code changes. All of them
# ship manylinux wheels, so no compiler is needed.
RUN pip install --only-binary=:all: -r constraints.txt

COPY pyproject.toml README.md ./
COPY client ./client
COPY gateway ./gateway
COPY discovery ./discovery
RUN pip install --no-index --no-build-isolation ".[gateway,otel]" && pip check

FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 offload \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin offload
COPY --from=build /opt/venv /opt/venv
# Bytecode was compiled at install time; the running container cannot write it anyway.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    OFFLOAD_LOG_FORMAT=json
# Numeric, so Kubernetes can verify runAsNonRoot without reading /etc/passwd.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
# For plain `docker run`; Kubernetes ignores it and uses the chart's probes. Plain HTTP only:
# with OFFLOAD_TLS_* set, override or disable it.
HEALTHCHECK --interval=30s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["offload-gateway"]
CMD ["--host", "0.0.0.0", "--port", "8080"]
