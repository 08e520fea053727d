"""txstream service: the stages (runner), configuration, the Spark engine and embedded defaults."""
