"""The sidecar exporter: event ingest, aggregation into the catalogue's metrics, and /metrics."""
