"""The columns of the index's ``runs`` table: what each holds, where it is read from, its unit.

:data:`INDEX_COLUMNS` lists the data columns, each an :class:`IndexColumn` naming the file
(``manifest`` or ``summary``) and the dotted path its value is read from; the bookkeeping
columns (the run's id, path and state, and the file stamps a refresh compares, as
:data:`FileKey`) come first in the table. :data:`ALL_COLUMN_NAMES` is the table order,
:data:`BOOKKEEPING_DOCS` and each column's ``doc`` what ``perfscope query --columns`` shows.

Units (:data:`COLUMN_UNITS`): SI units for measurements, as the run's files store them
(seconds, tokens per second, requests per second, joules per token; the unit is in the name
where it is ambiguous: ``ttft_p50_s``, ``rate_req_s``), ``count`` for whole numbers of
things, ``fraction (0-1)`` for shares, nanoseconds since the epoch and bytes for the file
stamps. Changing a column or its meaning bumps :data:`INDEX_SCHEMA_VERSION`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ALL_COLUMN_NAMES",
    "BOOKKEEPING_DOCS",
    "COLUMN_UNITS",
    "INDEX_COLUMNS",
    "INDEX_SCHEMA_VERSION",
    "FileKey",
    "IndexColumn",
]

#: Bumped whenever the columns or their meaning change; an older index file is rebuilt.
INDEX_SCHEMA_VERSION = 8


@dataclass(frozen=True)
class IndexColumn:
    """One column of the ``runs`` table.

    Attributes:
        name: SQL column name (units in the name where ambiguous).
        sql_type: DuckDB type.
        source: ``manifest`` or ``summary``: the file the value is read from.
        path: dotted path inside that file's JSON object.
        doc: what the value means, with its unit.
        reduce: ``"count"`` stores the number of entries of the object or list at ``path``,
            ``"last"`` the last item of the list there, ``"count_lost"`` the number of
            items of the list there with a true ``lost`` field, ``"ns_to_s"`` the number
            there divided by 1e9, ``"per_request"`` / ``"per_completed"`` the number there
            divided by the run's measured / completed requests; ``None`` stores the value
            itself.
    """

    name: str
    sql_type: str
    source: str
    path: str
    doc: str
    reduce: str | None = None


def _c(
    name: str, sql_type: str, source: str, path: str, doc: str, *, reduce: str | None = None
) -> IndexColumn:
    return IndexColumn(name, sql_type, source, path, doc, reduce)


#: The data columns of ``runs`` (bookkeeping columns are added after them).
INDEX_COLUMNS: tuple[IndexColumn, ...] = (
    _c("name", "VARCHAR", "manifest", "name", "run name (default: the engine kind)"),
    _c("status", "VARCHAR", "manifest", "status", "status written by the run"),
    _c("started_at", "TIMESTAMPTZ", "manifest", "started_at", "wall-clock start"),
    _c("ended_at", "TIMESTAMPTZ", "manifest", "ended_at", "wall-clock end (NULL if none)"),
    _c("perfscope_version", "VARCHAR", "manifest", "perfscope_version", "writer's version"),
    _c("engine_uri", "VARCHAR", "manifest", "engine.uri", "engine URI"),
    _c("engine_kind", "VARCHAR", "manifest", "engine.kind", "reference, hf, openai, python"),
    _c("device", "VARCHAR", "manifest", "engine.device", "engine device (cpu, cuda:0, ...)"),
    _c("dtype", "VARCHAR", "manifest", "engine.dtype", "engine compute dtype"),
    _c("model", "VARCHAR", "manifest", "engine.model.name", "model spec name"),
    _c("hardware", "VARCHAR", "manifest", "hardware.spec.key", "hwdb key analysed against"),
    _c("hostname", "VARCHAR", "manifest", "host.hostname", "machine the run ran on"),
    _c("pid", "BIGINT", "manifest", "process.pid", "process id of the writer, if recorded"),
    _c("writer_host", "VARCHAR", "manifest", "process.host", "host of the writing process"),
    _c("load_mode", "VARCHAR", "manifest", "load.mode", "batch or online"),
    _c("rate_req_s", "DOUBLE", "manifest", "load.rate", "offered rate, requests/s"),
    _c("concurrency", "BIGINT", "manifest", "load.concurrency", "closed-loop users"),
    _c(
        "others_cpu_share",
        "DOUBLE",
        "manifest",
        "host.contention.others_share",
        "share of the machine's CPU other processes used during the run",
    ),
    _c("requests", "BIGINT", "summary", "counts.requests", "measured requests"),
    _c("completed", "BIGINT", "summary", "counts.completed", "requests that completed"),
    _c("failed", "BIGINT", "summary", "counts.failed", "requests that failed"),
    _c("output_tokens", "BIGINT", "summary", "counts.output_tokens", "output tokens"),
    _c("prompt_tokens", "BIGINT", "summary", "counts.prompt_tokens", "prompt tokens"),
    _c("window_s", "DOUBLE", "summary", "window_s", "measured window, s"),
    _c("ttft_p50_s", "DOUBLE", "summary", "latency.ttft.p50", "TTFT median, s"),
    _c("ttft_p90_s", "DOUBLE", "summary", "latency.ttft.p90", "TTFT p90, s"),
    _c("ttft_p99_s", "DOUBLE", "summary", "latency.ttft.p99", "TTFT p99, s"),
    _c("tpot_p50_s", "DOUBLE", "summary", "latency.tpot.p50", "TPOT median, s"),
    _c("tpot_p99_s", "DOUBLE", "summary", "latency.tpot.p99", "TPOT p99, s"),
    _c("itl_p50_s", "DOUBLE", "summary", "latency.itl.p50", "ITL median, s"),
    _c("itl_p99_s", "DOUBLE", "summary", "latency.itl.p99", "ITL p99, s"),
    _c("e2e_p50_s", "DOUBLE", "summary", "latency.e2e.p50", "E2E median, s"),
    _c("e2e_p99_s", "DOUBLE", "summary", "latency.e2e.p99", "E2E p99, s"),
    _c("output_tok_s", "DOUBLE", "summary", "throughput.output_tok_s", "output tokens/s"),
    _c("total_tok_s", "DOUBLE", "summary", "throughput.total_tok_s", "prompt+output tokens/s"),
    _c("req_s", "DOUBLE", "summary", "throughput.req_s", "completed requests/s"),
    _c("goodput_req_s", "DOUBLE", "summary", "goodput.goodput_req_s", "requests/s meeting SLOs"),
    _c("attainment", "DOUBLE", "summary", "goodput.attainment", "share meeting every SLO"),
    _c("prefill_mfu", "DOUBLE", "summary", "roofline.phases.prefill.mfu", "prefill MFU (0-1)"),
    _c("prefill_mbu", "DOUBLE", "summary", "roofline.phases.prefill.mbu", "prefill MBU (0-1)"),
    _c("prefill_verdict", "VARCHAR", "summary", "roofline.phases.prefill.verdict", "prefill bound"),
    _c("decode_mfu", "DOUBLE", "summary", "roofline.phases.decode.mfu", "decode MFU (0-1)"),
    _c("decode_mbu", "DOUBLE", "summary", "roofline.phases.decode.mbu", "decode MBU (0-1)"),
    _c("decode_verdict", "VARCHAR", "summary", "roofline.phases.decode.verdict", "decode bound"),
    _c(
        "j_per_output_token",
        "DOUBLE",
        "summary",
        "energy.j_per_output_token",
        "energy per output token, J",
    ),
    _c("summary_schema", "VARCHAR", "summary", "schema", "summary schema of the stored file"),
    _c(
        "slo_count",
        "BIGINT",
        "summary",
        "goodput.slos",
        "SLOs the run was judged by",
        reduce="count",
    ),
    _c("last_error", "VARCHAR", "manifest", "errors", "last error the run recorded", reduce="last"),
    _c("sweep_id", "VARCHAR", "manifest", "sweep.id", "sweep the run is a point of"),
    _c("model_preset", "VARCHAR", "manifest", "engine.config.preset", "model preset name"),
    _c("model_layers", "BIGINT", "manifest", "engine.model.n_layers", "layers of the model spec"),
    _c("analysed_model", "VARCHAR", "summary", "model.name", "model spec the analysis used"),
    _c("hardware_name", "VARCHAR", "summary", "hardware.spec.name", "device analysed against"),
    _c("roofline_available", "BOOLEAN", "summary", "roofline.available", "roofline computed"),
    _c("energy_available", "BOOLEAN", "summary", "energy.available", "energy measured"),
    _c("contended", "BOOLEAN", "summary", "contention.contended", "CPU contention flagged"),
    _c(
        "steal_cpu_share",
        "DOUBLE",
        "manifest",
        "host.contention.steal_share",
        "share of the machine's CPU the hypervisor stole during the run",
    ),
    _c("dataset", "VARCHAR", "manifest", "workload.dataset", "workload dataset (synthetic, ...)"),
    _c(
        "prompt_len_spec",
        "VARCHAR",
        "manifest",
        "workload.prompt_len",
        "prompt length asked for, tokens (a number or a distribution, as given)",
    ),
    _c(
        "output_len_spec",
        "VARCHAR",
        "manifest",
        "workload.output_len",
        "output length asked for, tokens (a number or a distribution, as given)",
    ),
    _c(
        "prompt_tokens_per_request",
        "DOUBLE",
        "summary",
        "counts.prompt_tokens",
        "mean prompt length of the measured requests, tokens",
        reduce="per_request",
    ),
    _c(
        "output_tokens_per_request",
        "DOUBLE",
        "summary",
        "counts.output_tokens",
        "mean output length of the completed requests, tokens",
        reduce="per_completed",
    ),
    _c(
        "distributed_backend",
        "VARCHAR",
        "manifest",
        "distributed.backend",
        "'ray' for a --ray run, NULL for a single-process one",
    ),
    _c("ray_address", "VARCHAR", "manifest", "distributed.address", "Ray cluster the run used"),
    _c(
        "ray_actors",
        "BIGINT",
        "manifest",
        "distributed.actors",
        "load actors of a --ray run",
        reduce="count",
    ),
    _c(
        "ray_lost_actors",
        "BIGINT",
        "manifest",
        "distributed.actors",
        "load actors lost mid-run (the run is partial when > 0)",
        reduce="count_lost",
    ),
    _c(
        "ray_lost_in_flight",
        "BIGINT",
        "manifest",
        "distributed.loss.in_flight",
        "requests a lost actor had sent and not finished (recorded as failed)",
    ),
    _c(
        "ray_never_sent",
        "BIGINT",
        "manifest",
        "distributed.loss.never_sent",
        "requests planned on a lost actor that it never sent (recorded as failed)",
    ),
    _c(
        "ray_clock_uncertainty_s",
        "DOUBLE",
        "manifest",
        "distributed.clock_uncertainty_ns",
        "largest residual clock-alignment uncertainty over the load actors, s",
        reduce="ns_to_s",
    ),
)

#: Each data column as the reader walks it: (name, SQL type, source file, path split into
#: keys once, reduce), so a first build over thousands of runs does not split every path
#: of every run again.
_COLUMN_PLAN: tuple[tuple[str, str, str, tuple[str, ...], str | None], ...] = tuple(
    (c.name, c.sql_type, c.source, tuple(c.path.split(".")), c.reduce) for c in INDEX_COLUMNS
)

#: What each bookkeeping column means (``perfscope query --columns``).
BOOKKEEPING_DOCS: dict[str, str] = {
    "run_id": "run directory name (undecodable bytes shown as \\xNN)",
    "path": "run directory path",
    "state": "complete, partial, failed, interrupted, running, crashed or broken: the "
    "status as perfscope ls reads it (crashed: says running but its process is gone; "
    "broken: files cannot be read)",
    "problem": "why the state is not complete (the reason perfscope ls shows), else NULL",
    "has_summary": "summary.json exists and is perfscope's",
    "warnings": "number of warnings in summary.json",
    "manifest_mtime_ns": "manifest.json modification time, ns since the epoch (refresh key)",
    "manifest_size": "manifest.json size, bytes (refresh key)",
    "summary_mtime_ns": "summary.json modification time, ns since the epoch (refresh key)",
    "summary_size": "summary.json size, bytes; -1 when absent (refresh key)",
    "files_key": "run folder mtime, ns; for a broken run a digest of every file's identity "
    "(refresh key)",
}

_BOOKKEEPING = (
    ("run_id", "VARCHAR PRIMARY KEY"),
    ("path", "VARCHAR"),
    ("state", "VARCHAR"),
    ("problem", "VARCHAR"),
    ("has_summary", "BOOLEAN"),
    ("warnings", "BIGINT"),
    ("manifest_mtime_ns", "BIGINT"),
    ("manifest_size", "BIGINT"),
    ("summary_mtime_ns", "BIGINT"),
    ("summary_size", "BIGINT"),
    ("files_key", "BIGINT"),
)

#: The unit of every column of ``runs`` (``perfscope query --columns``): SI units for
#: measurements, ``count`` for whole numbers of things, ``fraction`` for shares 0-1,
#: ``text``/``true/false``/``timestamp`` for the rest.
_TIME_S = (
    "window_s ttft_p50_s ttft_p90_s ttft_p99_s tpot_p50_s tpot_p99_s itl_p50_s itl_p99_s "
    "e2e_p50_s e2e_p99_s ray_clock_uncertainty_s"
)
_COUNTS = (
    "warnings requests completed failed concurrency slo_count model_layers ray_actors "
    "ray_lost_actors ray_lost_in_flight ray_never_sent"
)
_FRACTIONS = (
    "others_cpu_share steal_cpu_share attainment prefill_mfu prefill_mbu decode_mfu decode_mbu"
)
COLUMN_UNITS: dict[str, str] = {
    **dict.fromkeys(_TIME_S.split(), "s"),
    **dict.fromkeys(_COUNTS.split(), "count"),
    **dict.fromkeys(_FRACTIONS.split(), "fraction (0-1)"),
    **dict.fromkeys(("manifest_mtime_ns", "summary_mtime_ns"), "ns since the epoch"),
    **dict.fromkeys(("manifest_size", "summary_size"), "bytes"),
    **dict.fromkeys(("started_at", "ended_at"), "timestamp (UTC)"),
    **dict.fromkeys(("output_tokens", "prompt_tokens"), "tokens"),
    **dict.fromkeys(("prompt_tokens_per_request", "output_tokens_per_request"), "tokens"),
    **dict.fromkeys(("prompt_len_spec", "output_len_spec"), "tokens (as given)"),
    **dict.fromkeys(("output_tok_s", "total_tok_s"), "tokens/s"),
    **dict.fromkeys(("rate_req_s", "req_s", "goodput_req_s"), "requests/s"),
    "j_per_output_token": "J/token",
    "files_key": "ns, or a digest",
    "pid": "process id",
}

#: Every column of ``runs`` in table order.
ALL_COLUMN_NAMES: tuple[str, ...] = tuple(n for n, _ in _BOOKKEEPING) + tuple(
    c.name for c in INDEX_COLUMNS
)
_TYPES = {n: t.split()[0] for n, t in _BOOKKEEPING} | {c.name: c.sql_type for c in INDEX_COLUMNS}
for _name in ALL_COLUMN_NAMES:  # the rest by type: text, true/false
    COLUMN_UNITS.setdefault(_name, {"BOOLEAN": "true/false"}.get(_TYPES[_name], "text"))

#: What a refresh compares to decide whether a run must be re-read: manifest.json's and
#: summary.json's (mtime_ns, size), then the run directory's own mtime_ns (it changes when a
#: file in it is created, removed or atomically replaced, which is how the store writes its
#: tables). A run the index holds as broken gets a stronger last field instead: a 63-bit
#: digest of the identity (name, inode, mtime_ns, size) of every file at the top of its
#: folder, so a table rewritten in place (a copy still in progress) re-reads it too.
FileKey = tuple[int, int, int, int, int]
