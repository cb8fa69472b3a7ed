"""rlhf-exporter: where the throughput of verl RLHF jobs goes, as Prometheus metrics."""

__version__ = "0.1.0"
