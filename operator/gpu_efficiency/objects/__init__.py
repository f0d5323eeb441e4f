"""Kubernetes object codecs shared by the sources that read the objects and the actuators that
write them (engine records <-> API JSON), below both and above the engine: no I/O here, and the
engine never needs the wire shape.

- ``dra``: ResourceSlices, ResourceClaims and our DeviceTaintRules (``resource.k8s.io``).
"""
