"""Helpers the tests share (tests/ is on the import path, so `from support.x import y`):

* `service_process`: `txstream run` in a subprocess, and scraping its HTTP endpoint;
* `orders`: the example pipeline's events, configuration and from-scratch results;
* `runner`: an in-process runner of the example pipeline, run in a background thread;
* `chromium`: a headless browser over the DevTools protocol;
* `kafka_settings`: reading what the service gives librdkafka;
* `halting_pipeline`: a pipeline whose expression fails on some data.
"""
