"""The operations services as library code: the node agent (``wattflex control``), M&V of each
event, the Prometheus exporter and its dashboard, flexibility offers and statements."""
