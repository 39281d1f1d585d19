"""A run's traces: the OpenTelemetry sink (``tracing``, one trace per run across attempts) and the pipe its
spans go through to a child process running the OTLP exporter (``spanexport``)."""
