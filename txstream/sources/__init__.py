"""The input side: Kafka records -> decoded rows -> numbered transactions."""
