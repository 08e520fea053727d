"""Live tables: outputs kept in the service as keyed tables with row keys, whose changes are
published per transaction as `txstream.updates.TableUpdate`s.

    sink       the `live` sink: an output's changes applied to its live table
    table      a keyed output kept live, sorted, with row keys; one TableUpdate per transaction
    keyspace   row keys for a sorted table: kept while a row lives, new ones between neighbours
    serving    the service's live tables and their subscribers, shared across threads
    viewport   viewport subscriptions: a sorted view's range a subscriber follows
    flight     the live tables over Arrow Flight, next to the HTTP port
    page       the `/ui` page: each served table through a viewport, as server-sent events
    page_http  the page over HTTP: routing, server-sent events, its token
"""
