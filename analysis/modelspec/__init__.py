"""Shape and storage facts of a transformer decoder, enough to count FLOPs and bytes.

A run's manifest carries the engine's model as a plain dict (``manifest["model"]``) with
exactly the field names of :class:`ModelSpec`; :meth:`ModelSpec.from_dict` reads it back.

Constructors: :meth:`ModelSpec.from_hf_config` (a Hugging Face ``config.json`` or its dict),
:meth:`ModelSpec.from_preset` (named public models, see :data:`PRESETS`),
:meth:`ModelSpec.from_dict` (the reference engine's ``ReferenceConfig.model_spec()`` or a
manifest) and :meth:`ModelSpec.resolve` (whatever a user typed: preset name or path).

The package is split by concern; every public name is re-exported here:

- :mod:`.dtypes`: storage widths (bytes per element, per quantised weight);
- :mod:`.spec`: the :class:`ModelSpec` record and its derived views;
- :mod:`.hf_config`: loading a ``config.json`` and normalising it through transformers;
- :mod:`.quant`: quantised checkpoint layouts;
- :mod:`.families`: the family rules and the refused families with their reasons;
- :mod:`.readers`: a normalised config to a :class:`ModelSpec`, one reader per layout;
- :mod:`.presets`: named public models.
"""

from __future__ import annotations

from perfscope.analysis.modelspec.dtypes import (
    DTYPE_BYTES,
    compute_dtype_for,
    dtype_bytes,
    weight_bytes_per_param,
)
from perfscope.analysis.modelspec.families import FAMILIES, REFUSED, Family, family_for
from perfscope.analysis.modelspec.hf_config import normalised_config
from perfscope.analysis.modelspec.presets import PRESETS, preset_names
from perfscope.analysis.modelspec.quant import QuantLayout, quant_layout
from perfscope.analysis.modelspec.spec import (
    ATTENTION_KINDS,
    MIXERS,
    LayerAttention,
    ModelSpec,
    apply_dtype_overrides,
)
from perfscope.hwdb.spec import normalize_dtype

__all__ = [
    "ATTENTION_KINDS",
    "DTYPE_BYTES",
    "FAMILIES",
    "MIXERS",
    "PRESETS",
    "REFUSED",
    "Family",
    "LayerAttention",
    "ModelSpec",
    "QuantLayout",
    "apply_dtype_overrides",
    "compute_dtype_for",
    "dtype_bytes",
    "family_for",
    "normalised_config",
    "normalize_dtype",
    "preset_names",
    "quant_layout",
    "weight_bytes_per_param",
]
