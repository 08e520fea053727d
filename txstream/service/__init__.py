"""The service: a configured pipeline run as stages (ingest -> compute -> deliver ->
checkpoint) over the input connectors (`txstream.sources`), the engine (`txstream.engine`) and
the output connectors (`txstream.sinks`), with its commands, health and recovery.

Running (no Kafka client, no Spark: handed in by `compose`):
    runner          PipelineRunner: the stages' bodies and the run loop
    stages          the queues and signals between the stages, retries, crash points
    input           Input: what the runner reads from (KafkaInput is the service's)
    resume          where a run resumes: the newest checkpoint and the transactions logged after
    idle_warm_up    the engine's warm-up, one step at a time while idle, cut short by work
    net_groups      which transactions of a batch the engine computes as one, on replay too
    invariants      invariants checked where changes cross a stage (a violation halts)
    outputs         the pipeline's sinks, written together; the progress row
    checkpointing   the checkpoint stage: when one is due, writing it in the background
    startup         the checks before a start, as pure functions of what they look at
Checkpoints:
    checkpoint      CheckpointStore: checkpoints and the transaction log at one location
    checkpoint_storage   a local directory or a Hadoop-compatible URI (through Spark's JVM)
    checkpoint_epochs    writer epochs in the location: a second instance is fenced
Health:
    metrics         one recorder per stage; the Prometheus text
    health          liveness, readiness, the HTTP endpoint (/healthz, /readyz, /metrics)
    input_reports   the input monitor's measurements into metrics and readiness
    leadership      one active instance per pipeline, the others standbys
Composing and commands:
    compose         open_runner: the pipeline checked, Spark, the engine, the checkpoint
                    store and the Kafka input composed into a runner
    pipelines       a pipeline definition loaded from `module:function`
    spark           the long-lived SparkSession
    class_archive   the driver JVM's class-data archive: where it is, the JVM options using it
    prepare         `txstream prepare`: writing that archive
    cli             the `txstream` command: run, check, demo, replay, prepare
    check           `txstream check`: everything `run` needs, tried without changing anything
    demo            `txstream demo`: the example pipeline end to end on embedded defaults
    replay          `txstream replay`: a recorded change log through a pipeline, without Kafka
    embedded/       a Kafka-protocol broker process and a throwaway PostgreSQL for local runs
"""
