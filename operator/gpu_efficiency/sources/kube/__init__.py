"""Kubernetes reads: nodes, pods and owners (``cluster``, ``owners``, ``crd_owners``), DRA
ResourceSlices, claims and DeviceTaintRules (``dra``), and the watch caches over them (``watch``,
``cluster_cache``, ``dra_cache``) that make a steady cycle LIST nothing."""
