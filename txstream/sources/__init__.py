"""The input side: Kafka records -> decoded rows -> numbered transactions.

Pure (no Kafka client; tested without a broker):
    kafka_source       what records become: RawRecords, decoded rows' bookkeeping, BadRecord
    decoder            SourceDecoder: one topic's RawRecords -> rows + bad records
    json_values, field_checks, single_records   the decoder's parts
    record_columns     columns from outside the row: upstream transaction, Kafka metadata
    registry/          values framed in Confluent's wire format, decoded with their writer
                       schema (Avro, JSON Schema, Protobuf); its `client` alone talks to a
                       Schema Registry
    boundaries         TransactionBoundaries: records as arrays -> closed transactions
    open_transactions, positions   its parts: rules, mini-batches, emission order, offsets
    debezium/          Debezium's envelope: transaction metadata, ids, tombstones and TOAST
                       values, decimals, records that change no row
    pending            decoded rows of open transactions -> one Changes per source
    upsert             the current row of every key of an upsert source (truncates delete them all)
    transaction_batch  Transaction, TransactionBatch: what the input hands to the service
    source_checks, source_state   sources checked together; what a restart resumes from
With the Kafka client:
    transactions       TransactionBuilder: polls, decodes, commits (thin)
    consumed           the client's records as plain data
    dead_letters       the dead-letter producer
    kafka_monitor      lag and latency, off the service's threads
    kafka_input        KafkaInput: the builder and the monitor as the service sees them
"""
