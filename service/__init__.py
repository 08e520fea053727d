"""txstream service: the loop, configuration, the Spark engine and embedded defaults."""
