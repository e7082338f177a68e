"""delivery: a PySpark Structured Streaming job that fans whole epochs out to the sinks."""
