"""Loading a Hugging Face ``config.json`` and normalising it through transformers' config class."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from perfscope.errors import UsageError
from perfscope.jsontypes import JsonObject


def _load_config(config: JsonObject | str | Path) -> tuple[JsonObject, str]:
    if isinstance(config, dict):
        return config, str(config.get("_name_or_path") or config.get("model_type") or "hf")
    path = Path(config).expanduser()
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"model config {str(path)!r} does not exist") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read model config {str(path)!r}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"model config {str(path)!r} is not a JSON object")
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return data, name


def normalised_config(cfg: JsonObject) -> tuple[JsonObject | None, str]:
    """``cfg`` as the installed transformers' config class reads it, or ``(None, why not)``.

    The config class (``AutoConfig.for_model(**cfg)``, what ``from_pretrained`` does with a
    local ``config.json``) applies the version's defaults and renames; its ``to_dict()`` is
    then overlaid with every ``attribute_map`` alias (``num_experts`` for Qwen3-MoE's saved
    ``num_local_experts``, ``hidden_size`` for GPT-2's ``n_embd``), so the readers below
    find a field under either spelling. Sub-configs (``text_config``, ``vision_config``) are
    normalised the same way. Returns the dict and a short description of the class used.
    """
    mt = cfg.get("model_type")
    if not mt or not isinstance(mt, str):
        return None, "the config has no model_type"
    try:
        import transformers
    except ImportError:
        return None, "transformers is not installed"
    try:
        mapping = transformers.CONFIG_MAPPING
        if mt not in mapping:
            return None, f"transformers {transformers.__version__} does not know {mt!r}"
        cls = mapping[mt]
        # The class takes the free-form JSON as keywords and judges it itself (a rejection
        # is caught below), so it is called as a constructor of any keywords.
        build: Callable[..., object] = cls
        # save_pretrained writes inf/nan as {"__float__": "Infinity"} (Mamba2 hybrids'
        # time_step_limit); from_pretrained decodes them before the class sees them.
        decode = getattr(cls, "_decode_special_floats", None)
        raw = decode(cfg) if callable(decode) else cfg
        obj = build(**{k: v for k, v in raw.items() if k != "model_type"})
    except Exception as exc:  # a config class rejecting its input: fall back to raw JSON
        return None, f"{type(exc).__name__} from the config class: {str(exc)[:120]}"
    out = _config_to_dict(obj, transformers.PretrainedConfig)
    for k, v in cfg.items():  # keys the class dropped (quantization_config of old writers)
        out.setdefault(k, v)
    return out, f"{transformers.__version__} ({type(obj).__name__})"


def _config_to_dict(obj: Any, base: type) -> JsonObject:
    """A transformers config object's ``to_dict()`` (what ``save_pretrained`` writes as
    ``config.json``) with its aliases and sub-configs."""
    out: JsonObject = dict(obj.to_dict())
    for alias in getattr(obj, "attribute_map", {}) or {}:
        try:
            out[alias] = getattr(obj, alias)
        except AttributeError:
            continue
    for k, v in list(vars(obj).items()):
        if isinstance(v, base):
            out[k] = _config_to_dict(v, base)
    return out


def _first_of(cfg: Mapping[str, object], *keys: str, default: object = None) -> object:
    """The value of the first of ``keys`` (aliases of one config field) that ``cfg`` sets."""
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return v
    return default


def _as_int(value: object, *keys: str) -> int:
    """``value`` (read under ``keys``) as an integer: a JSON number, a float cut as ``int``
    cuts it. Anything else (text, a flag, a list, nothing) is refused in one line."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    raise UsageError(f"model config {' / '.join(keys)} is {value!r}: not a number")


def _as_float(value: object, *keys: str) -> float:
    """``value`` (read under ``keys``) as a float; anything but a JSON number is refused."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise UsageError(f"model config {' / '.join(keys)} is {value!r}: not a number")


def _ints(value: object, *keys: str) -> list[int]:
    """A config's list of integers (layer indices) read under ``keys``: ``[]`` when absent;
    a value that is not a list of numbers is refused in one line."""
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise UsageError(f"model config {' / '.join(keys)} is {value!r}: not a list")
    return [_as_int(v, *keys) for v in value]


def _int_of(cfg: Mapping[str, object], *keys: str, default: object = None) -> int:
    """:func:`_first_of` narrowed to an integer (:func:`_as_int`)."""
    return _as_int(_first_of(cfg, *keys, default=default), *keys)


def _float_of(cfg: Mapping[str, object], *keys: str, default: object = None) -> float:
    """:func:`_first_of` narrowed to a float (:func:`_as_float`)."""
    return _as_float(_first_of(cfg, *keys, default=default), *keys)


def _require(cfg: Mapping[str, object], *keys: str) -> int:
    v = _first_of(cfg, *keys)
    if v is None:
        raise UsageError(
            f"model config has no {' / '.join(keys)}: not a decoder config perfscope can read "
            f"(model_type {cfg.get('model_type')!r})"
        )
    return _as_int(v, *keys)
