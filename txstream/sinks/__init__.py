"""The output connectors: each output table's changes, one batch of transactions at a time, to
PostgreSQL, Kafka, files or live tables. Every sink implements `sink.Sink`.

    sink                   the contract every output connector implements, and its errors
    factory                a sink opened from its settings (`txstream.schemas.sinks`)
    conform                changes conformed to the output's columns and types; +1/-1 for keyed
    postgres/              live snapshots and append streams in PostgreSQL, the progress row
    kafka_sink             changes to a Kafka topic, one Kafka transaction per write
    kafka_readback         the last stream transaction a Kafka topic holds (replay skips to it)
    change_json            the JSON form of change rows (Kafka and file sinks)
    file_sink              changes appended to a local file
    update_records         Deephaven-style update records: added, removed, modified per transaction
    live/                  live tables with row keys, served over Arrow Flight and the /ui page
"""
