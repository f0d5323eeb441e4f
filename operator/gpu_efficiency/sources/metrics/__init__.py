"""Metric sources: what the GPUs did. Prometheus (``prometheus/``, dcgm-exporter's series) and the
node agents (``agent``, ``combined``), behind one ``SampleSource`` (``base``); ``targets`` says which
scrape target to believe for a GPU, ``labels`` reads a series' identity, ``deadline`` bounds a read."""
