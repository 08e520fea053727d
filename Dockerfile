# syntax=docker/dockerfile:1
# The txstream service image: Python 3.11 with Java 17 for pyspark, the project installed,
# a non-root user, `txstream run` as the entrypoint. Build at the repository root:
#   docker build -t txstream .
#   docker run --rm -e KAFKA_BOOTSTRAP_SERVERS=... -e DATABASE_URL=... txstream
# The same image also runs Spark standalone masters/workers (`spark-class`, see
# docker-compose.yml) and Spark executor pods, so driver and executors share one Python and
# one pyspark.

# bookworm pinned: its openjdk-17 is the Java that pyspark 4 needs.
FROM python:3.11-slim-bookworm

# procps gives `ps`, which Spark's launch scripts call; tini as PID 1 forwards SIGTERM to
# txstream for a clean stop and reaps the JVM that pyspark starts as a child.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps tini \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, in their own layer: pyspark alone is hundreds of MB, and this layer then
# survives every change to the code.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY README.md ./
COPY txstream ./txstream
RUN pip install --no-deps .

# The event generator of docker-compose.yml, the entrypoint of Spark executor pods (Helm chart
# with a k8s:// master) and the default pipeline config.
COPY deploy/generator.py deploy/spark-executor.sh ./deploy/
COPY deploy/pipeline.yaml /etc/txstream/pipeline.yaml

# The checkpoint dir of deploy/pipeline.yaml, owned by the user so that a volume mounted there
# starts with the right owner.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/txstream txstream \
    && mkdir -p /var/lib/txstream/checkpoints \
    && chown -R txstream:txstream /var/lib/txstream
USER 10001:10001

# Port of /healthz, /readyz and /metrics: keep equal to `http_port` of the pipeline config.
ENV TXSTREAM_HEALTHCHECK_PORT=8080
EXPOSE 8080

# No curl in the slim image: Python's urllib does the probe; any non-2xx answer raises.
# Spark's session start and first job take 10-15 s, hence the start period.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ['TXSTREAM_HEALTHCHECK_PORT'], timeout=4)"]

ENTRYPOINT ["tini", "--", "txstream", "run"]
CMD ["/etc/txstream/pipeline.yaml"]
