"""Debezium's change events: what its envelope means beyond a row's before and after. Pure:
Arrow arrays and decoded rows in and out, no Kafka client.

    metadata  the transaction metadata topic's END events -> expected counts per transaction
    ids       the transaction part of each connector's ids (PostgreSQL's txId:LSN, ...)
    rows      tombstones and unchanged TOAST values resolved against the key's row before them
    decimals  `precise` decimals: base64 of the unscaled value -> Decimal
    events    records that change no row (heartbeats, schema changes, messages), told apart
              from bad records
"""
