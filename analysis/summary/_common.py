"""What the summary's modules share: the schema and the reason of an absent section."""

from __future__ import annotations

__all__ = ["ABSENT", "SUMMARY_SCHEMA", "SUMMARY_SCHEMAS"]

SUMMARY_SCHEMA = "perfscope.summary/2"
#: Schemas :meth:`Summary.from_dict` reads (``/1``: perfscope 0.1.0, same key layout).
SUMMARY_SCHEMAS = ("perfscope.summary/1", SUMMARY_SCHEMA)

#: The reason of a section the summary does not have.
ABSENT = "not in this summary (written by an older perfscope, or the analysis did not run)"
