# spo-service: nginx in front of gunicorn in one container (`spo serve --nginx`), on $PORT (default 8080).
#
#   make image                               # builds and tags spo-service:latest (BuildKit)
#   make image CA_BUNDLE=/path/to/ca.pem     # pip trusts this CA bundle (a TLS-intercepting proxy)
#   docker run --rm --stop-timeout 45 -p 8080:8080 spo-service:latest   # the whole graceful stop
#
# Build inputs (docs/deploy.md):
#   secret "ca"         a PEM CA bundle for pip (BuildKit secret: never stored in a layer)
#   ARG MODELS          directory of model directories in the build context, baked in as /models
#                       (default: models, the two demo models); each self-contained (its vocab inside)
#   ARG SPO_MODELS      what the image serves by default (NAME=DIR,...; the first is /v1/extract's)
#   ARG TENSORFLOW      the TensorFlow distribution: tensorflow-cpu (default: no CUDA libraries)
#                       or tensorflow (the wheel the rest of the project pins)
#
# Build stages, ordered by how often they change: `pins` (the serving pins, from requirements.lock and
# pyproject.toml), `deps` (those pins installed, TensorFlow trimmed: rebuilt only when a pin changes,
# not on any other edit of pyproject.toml), `venv` (the same without pip) and `project` (the project's
# wheel, installed beside them: rebuilt on every code change, in seconds). `runtime` has only Python,
# nginx, tini, jemalloc, the venv, the models and the project, its layers in that order: a code change
# makes one new top layer of the project's size (about 41 MB), never a new copy of TensorFlow
# (docs/deploy.md, "Layers").

ARG BASE=debian:bookworm-slim

FROM ${BASE} AS python
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        python3 python3-venv ca-certificates binutils >/dev/null \
    && rm -rf /var/lib/apt/lists/*

# Serving pins only (deploy/image/serving_pins.py): the project's runtime dependencies at the exact
# versions of requirements.lock, TensorFlow as $TENSORFLOW; tf-keras and bert4keras go in with
# --no-deps (tf-keras declares `tensorflow`, bert4keras keras<=2.3.1).
FROM python AS pins
ARG TENSORFLOW=tensorflow-cpu
COPY requirements.lock pyproject.toml deploy/image/serving_pins.py /src/
RUN python3 /src/serving_pins.py /src/pyproject.toml /src/requirements.lock "${TENSORFLOW}" /pins

# Then what serving never loads goes (docs/deploy.md, "Image size"): TensorFlow's C++ headers and
# symbol tables (strip: 219 MB); the packages TensorFlow declares for what this service does not use:
# keras 3 and its console helpers (tf.keras is tf-keras here: TF_USE_LEGACY_KERAS=1), libclang (op
# code generators), grpcio (distributed TensorFlow); faker (the training corpus generator).
FROM python AS deps
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_DEFAULT_TIMEOUT=180
COPY --from=pins /pins /pins
RUN --mount=type=secret,id=ca \
    set -eu; \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    python3 -m venv /opt/venv; \
    /opt/venv/bin/pip install -q -c /pins/constraints.txt -r /pins/serving.txt; \
    /opt/venv/bin/pip install -q --no-deps -r /pins/nodeps.txt; \
    rm -rf /opt/venv/lib/python3.11/site-packages/tensorflow/include; \
    find /opt/venv/lib/python3.11/site-packages/tensorflow -name '*.so*' -type f \
        -exec strip --strip-unneeded {} +; \
    /opt/venv/bin/pip uninstall -q -y keras rich pygments markdown-it-py mdurl namex optree \
        libclang grpcio faker

# What the image runs: the same venv without pip.
FROM deps AS venv
RUN /opt/venv/bin/pip uninstall -q -y pip

# The project's wheel (the demo models and the deploy templates are its package data), installed
# without its dependencies (they are the pins above) under its own prefix, /opt/project, with the
# venv's interpreter in its scripts: runtime lays it over /opt/venv.
FROM deps AS project
COPY pyproject.toml README.md /src/
COPY app /src/app
COPY nlp /src/nlp
COPY training /src/training
COPY models /src/models
COPY deploy /src/deploy
RUN --mount=type=secret,id=ca \
    set -eu; \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    /opt/venv/bin/pip wheel -q --no-deps -w /dist /src; \
    /opt/venv/bin/pip install -q --no-deps --no-warn-script-location --prefix /opt/project \
        /dist/spo_service-*.whl

FROM ${BASE} AS runtime
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        python3 nginx-light tini libjemalloc2 >/dev/null \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log \
    && groupadd --system --gid 10001 spo \
    && useradd --system --uid 10001 --gid spo --home-dir /nonexistent --shell /usr/sbin/nologin spo
COPY --from=venv /opt/venv /opt/venv
ARG MODELS=models
COPY ${MODELS} /models
COPY --from=project /opt/project/ /opt/venv/
ARG SPO_MODELS=demo=/models/demo,ner=/models/ner
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SPO_MODELS=${SPO_MODELS} \
    PORT=8080
USER spo:spo
WORKDIR /tmp
EXPOSE 8080
# /readyz waits behind the extraction requests a busy worker holds (each answered by its 20 s
# deadline): a busy container is not an unhealthy one (docs/deploy.md, the probes).
HEALTHCHECK --interval=10s --timeout=30s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('PORT', '8080'), timeout=25)"]
# tini (PID 1) reaps orphans and passes SIGTERM to `spo serve`, which stops nginx then gunicorn
# gracefully; the shell only expands $HOST and $PORT and replaces itself (exec). Without HOST nginx
# listens on every address, IPv4 and (where the kernel has it) IPv6: IPv6-only and dual-stack clusters
# reach it too; HOST narrows it to one address, e.g. HOST=127.0.0.1 with --network host.
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["/bin/sh", "-c", "exec spo serve --nginx \"${HOST:+$HOST:}${PORT:-8080}\""]
