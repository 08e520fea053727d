"""Example pipelines, shipped so that `make demo`, the benchmarks and a new user's first run
share them.

    orders        the example pipeline: customers and their orders (`make demo`, the image)
    order_events  its sample events: upserts and deletes of customers and orders
    groupby       Pathway's group-by benchmark as a pipeline (bench/end_to_end.py)
"""
