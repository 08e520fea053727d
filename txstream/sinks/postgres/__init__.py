"""The PostgreSQL output connectors: every output of a batch and the pipeline's progress row in
one PostgreSQL transaction, so a replay after a crash writes nothing twice.

    outputs   every PostgreSQL output of a pipeline committed together, with the progress row
    snapshot  live snapshot of a keyed output, correct under out-of-order delivery (time guard)
    append    every change of an output appended to a table (the stream of changes)
    rejects   rows PostgreSQL refuses, isolated so that the rest of a write goes through
    writers   one writer per pipeline: the lease a standby waits for and the fencing epoch
    common    identifier checks, table creation and validation, COPY of Arrow, retries
"""
