"""Live tables: outputs kept in the service as keyed tables with row keys, whose changes are
published per transaction as `txstream.updates.TableUpdate`s."""
