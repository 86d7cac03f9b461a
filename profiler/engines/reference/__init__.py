"""The built-in reference engine: a Llama-style decoder with a serving-style scheduler."""

from perfscope.profiler.engines.reference.engine import ReferenceEngine
from perfscope.profiler.engines.reference.model import PRESETS, ReferenceConfig, ReferenceModel

__all__ = ["PRESETS", "ReferenceConfig", "ReferenceEngine", "ReferenceModel"]
