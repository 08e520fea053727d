"""The input side: Kafka records -> decoded rows -> numbered transactions.

Pure (no Kafka client; tested without a broker):
    kafka_source       what records become: RawRecords, decoded rows' bookkeeping, BadRecord
    decoder            SourceDecoder: one topic's RawRecords -> rows + bad records
    json_values, field_checks, single_records, debezium_decimals   the decoder's parts
    framed_values      values in Confluent's wire format -> the JSON the decoder reads, or why not
    avro_values, json_schema_values, protobuf_values   its kinds: Avro bodies (fastavro), framed
                       JSON documents, Protobuf messages (protobuf, protoc from grpcio-tools)
    boundaries         TransactionBoundaries: records as arrays -> closed transactions
    open_transactions, positions   its parts: rules, mini-batches, emission order, offsets
    debezium_metadata  Debezium END events -> expected counts
    debezium_ids       the transaction part of each connector's ids (PostgreSQL's txId:LSN)
    debezium_rows      Debezium tombstones and unchanged TOAST values against the key's row
    debezium_events    Debezium's records that change no row: heartbeats, schema changes, messages
    pending            decoded rows of open transactions -> one Changes per source
    upsert             the current row of every key of an upsert source (truncates delete them all)
    transaction_batch  Transaction, TransactionBatch: what the input hands to the service
    source_checks, source_state   sources checked together; what a restart resumes from
With the Kafka client:
    transactions       TransactionBuilder: polls, decodes, commits (thin)
    consumed           the client's records as plain data
    dead_letters       the dead-letter producer
    schema_registry    writer schemas by id from a Schema Registry (its REST client)
    kafka_monitor      lag and latency, off the service's threads
    kafka_input        KafkaInput: the builder and the monitor as the service sees them
"""
