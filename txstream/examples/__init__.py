"""Example pipelines."""
