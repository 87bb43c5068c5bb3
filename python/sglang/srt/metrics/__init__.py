"""Prometheus metrics of the server (`--enable-metrics`, served at `/metrics`)."""
