#!/usr/bin/env bash
# Entrypoint of Spark executor pods when the service's Spark master is `k8s://...`.
# Spark starts executor pods with the argument `executor` and hands them their settings in
# environment variables (the contract of the entrypoint in Spark's own images). The Helm
# chart's executor pod template runs this script as the container command, so the image's
# entrypoint stays `txstream run` and executors use the image's pyspark and Python.
set -euo pipefail

if [[ "${1:-}" != executor ]]; then
  echo "usage: $0 executor   (started by Spark on Kubernetes in an executor pod)" >&2
  exit 64
fi

spark_home="$(python -c 'from pyspark.find_spark_home import _find_spark_home as f; print(f())')"

# The driver's settings arrive as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ... and keep that order.
java_opts=()
for ((i = 0; ; i++)); do
  var="SPARK_JAVA_OPT_$i"
  [[ -v $var ]] || break
  java_opts+=("${!var}")
done

exec java "${java_opts[@]}" \
  -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
  -cp "${SPARK_CONF_DIR:+$SPARK_CONF_DIR:}$spark_home/jars/*" \
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
  --driver-url "$SPARK_DRIVER_URL" \
  --executor-id "$SPARK_EXECUTOR_ID" \
  --cores "$SPARK_EXECUTOR_CORES" \
  --app-id "$SPARK_APPLICATION_ID" \
  --hostname "$SPARK_EXECUTOR_POD_IP" \
  --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
  --podName "$SPARK_EXECUTOR_POD_NAME"
