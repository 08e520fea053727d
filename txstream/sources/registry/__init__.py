"""Values framed in Confluent's wire format, decoded with the writer schema a Schema Registry
holds for their id, into the JSON object the decoder reads for a JSON value (so envelopes,
columns, checks and dead letters are shared with JSON sources).

    framed       the wire format: magic byte, schema id, body -> `FramedValues`, or why not
    avro         Avro bodies, decoded by fastavro and written as Kafka Connect's JSON would be
    json_schema  JSON documents framed by the JSON Schema serializer
    protobuf     Protobuf messages (message indexes, then the message; protoc from grpcio-tools)
    client       writer schemas by id from a Schema Registry (its REST client, cached)
"""
