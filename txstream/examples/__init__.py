"""Example pipelines, shipped so that `make demo`, the benchmarks and a new user's first run
share them.

    orders        the example pipeline: customers and their orders (`make demo`, the image)
    order_events  its sample events: upserts and deletes of customers and orders
    page_views    the event-time example: minutes emitted once, late views, sessions, views
                  priced as of their time, the last hour (`txstream demo --example page_views`)
    page_view_events  its sample events: views (a few late) and a CDC stream of prices
    groupby       Pathway's group-by benchmark as a pipeline (bench/end_to_end.py)
"""
