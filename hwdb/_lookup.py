"""Name matching: keys, aliases and raw driver strings → device keys, with suggestions."""

from __future__ import annotations

import difflib
import re

__all__ = ["NameIndex", "normalize_name", "strip_vendor_words"]

#: words that carry no identity in a device string ("NVIDIA", "Tesla", "GeForce", ...).
_VENDOR_WORDS = frozenset(
    {
        "nvidia",
        "tesla",
        "geforce",
        "quadro",
        "amd",
        "instinct",
        "radeon",
        "intel",
        "habana",
        "google",
        "cloud",
        "apple",
        "the",
    }
)
_WORD_RE = re.compile(r"[a-z0-9]+")


def normalize_name(name: str) -> str:
    """Case-, spacing- and punctuation-insensitive form.

    ``"NVIDIA A100-SXM4-80GB"`` → ``"nvidiaa100sxm480gb"``.
    """
    return "".join(_WORD_RE.findall(name.lower()))


def strip_vendor_words(name: str) -> str:
    """Normalized form without vendor/brand words: ``"NVIDIA GeForce RTX 4090"`` → ``"rtx4090"``."""
    return "".join(w for w in _WORD_RE.findall(name.lower()) if w not in _VENDOR_WORDS)


class NameIndex:
    """Exact (normalized) and vendor-stripped name → key maps."""

    def __init__(self) -> None:
        self.exact: dict[str, str] = {}
        self._stripped: dict[str, set[str]] = {}

    def conflicts(self, key: str, names: tuple[str, ...]) -> list[tuple[str, str]]:
        """``(name, other key)`` pairs where ``names`` collide with another device's names."""
        out = []
        for n in names:
            other = self.exact.get(normalize_name(n))
            if other is not None and other != key:
                out.append((n, other))
        return out

    def add(self, key: str, names: tuple[str, ...]) -> None:
        for n in names:
            norm = normalize_name(n)
            if norm:
                self.exact[norm] = key
            stripped = strip_vendor_words(n)
            if stripped:
                self._stripped.setdefault(stripped, set()).add(key)

    def remove(self, key: str) -> None:
        self.exact = {n: k for n, k in self.exact.items() if k != key}
        for keys in self._stripped.values():
            keys.discard(key)

    def find(self, name: str) -> str | None:
        """The key for ``name``, or ``None``; never guesses between several devices."""
        norm = normalize_name(name)
        if norm in self.exact:
            return self.exact[norm]
        stripped = strip_vendor_words(name)
        if not stripped:
            return None
        if stripped in self.exact:
            return self.exact[stripped]
        keys = self._stripped.get(stripped, set())
        return next(iter(keys)) if len(keys) == 1 else None

    def suggest(self, name: str, limit: int = 5) -> list[str]:
        """Nearest keys to an unknown name, best first."""
        query = strip_vendor_words(name) or normalize_name(name)
        if not query:
            return []
        best: dict[str, float] = {}
        forms = list(self.exact.items()) + [
            (s, k) for s, keys in self._stripped.items() for k in keys
        ]
        for form, key in forms:
            score = difflib.SequenceMatcher(None, query, form).ratio()
            if len(query) >= 2 and query in form:
                score += 0.5
            elif len(form) >= 2 and form in query:
                score += 0.3
            if score > best.get(key, 0.0):
                best[key] = score
        ranked = sorted((s, k) for k, s in best.items() if s >= 0.45)
        ranked.sort(key=lambda sk: (-sk[0], sk[1]))
        return [k for _, k in ranked[:limit]]
