"""The CRD's identity and what every section of the spec shares: the model base and the duration type.

Field docstrings become CRD descriptions (see ``api/crd.py``), so they are written for cluster
admins reading ``kubectl explain gep.spec``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from gpu_efficiency.api.durations import DURATION_PATTERN, Duration

GROUP = "gpuefficiency.io"
VERSION = "v1alpha1"
KIND = "GPUEfficiencyPolicy"
PLURAL = "gpuefficiencypolicies"
SINGULAR = "gpuefficiencypolicy"
SHORT_NAMES = ("gep",)
PREFIX = f"{GROUP}/"

#: Namespaces the operator never touches, whatever a policy says.
ALWAYS_PROTECTED_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")

#: The CRD generator appends ``DURATION_NOTE`` to each duration field's own description (a
#: description on the type would replace the field's docstring).
DURATION_NOTE = "A Go-style duration such as 30s, 5m or 1h30m."

__all__ = [
    "ALWAYS_PROTECTED_NAMESPACES",
    "DURATION_NOTE",
    "DURATION_PATTERN",
    "GROUP",
    "KIND",
    "PLURAL",
    "PREFIX",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "Duration",
    "Model",
]


class Model(BaseModel):
    """Base: camelCase on the wire, unknown fields rejected, docstrings as descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        frozen=True,
    )
