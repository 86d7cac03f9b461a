"""Records into Arrow columns without ever losing a row to a value that does not fit.

A server (or a manual-API caller) can hand over numbers no int64 column holds (10^30,
2^64), or a value of the wrong type. Converting such a column whole raises, and a writer
that gives up there loses every row of the batch. :func:`safe_arrays` converts each column
whole when it can (the fast, usual path) and otherwise cell by cell: a cell that does not
fit is stored as null, and the row's ``error`` (when the table has that column) names the
field and the value, so the request reads as failed for a stated reason.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

__all__ = ["UNREPRESENTABLE", "safe_arrays", "safe_table"]

#: What converting a value to its column's Arrow type raises for a value it cannot hold.
UNREPRESENTABLE = (OverflowError, TypeError, ValueError, pa.ArrowInvalid, pa.ArrowTypeError)


def safe_arrays(cols: list[list[Any]], schema: pa.Schema) -> list[pa.Array]:
    """``cols`` (one list per field of ``schema``, equal lengths) as Arrow arrays of the
    schema's types; ``error`` cells of rows with an unrepresentable value are amended
    (the lists in ``cols`` are edited in place)."""
    try:
        return [pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)]
    except UNREPRESENTABLE:
        pass
    err = cols[schema.get_field_index("error")] if "error" in schema.names else None
    order = sorted(range(len(schema)), key=lambda j: schema.field(j).name == "error")
    arrays: dict[int, pa.Array] = {}
    for j in order:  # "error" last: it takes the notes of the other columns
        f = schema.field(j)
        arrays[j] = _column(cols[j], f, err if f.name != "error" else None)
    return [arrays[j] for j in range(len(schema))]


def _column(col: list[Any], f: pa.Field, err: list[Any] | None) -> pa.Array:
    try:
        return pa.array(col, type=f.type)
    except UNREPRESENTABLE:
        pass
    kept: list[Any] = []
    for i, v in enumerate(col):
        try:
            pa.array([v], type=f.type)
            kept.append(v)
        except UNREPRESENTABLE:
            kept.append(None)
            if err is not None:
                text = repr(v)
                shown = text if len(text) <= 40 else text[:40] + "..."
                why = f"{f.name}={shown} does not fit {f.type}: stored as null"
                err[i] = f"{err[i]}; {why}" if isinstance(err[i], str) and err[i] else why
    try:
        return pa.array(kept, type=f.type)
    except UNREPRESENTABLE:  # a nullable column always holds nulls; this is a last resort
        return pa.nulls(len(col), type=f.type)


def safe_table(cols: dict[str, list[Any]], schema: pa.Schema) -> pa.Table:
    """:func:`safe_arrays` of a name → values mapping, as a table."""
    lists = [cols[name] for name in schema.names]
    return pa.Table.from_arrays(safe_arrays(lists, schema), schema=schema)
