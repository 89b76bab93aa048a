"""Corpus files: the input table, the output part files, and the record that makes a run resumable.

The output is a directory of Parquet files. The local runner writes `part-00000.parquet`,
`part-00001.parquet`, ... each to a hidden temporary file first and renames it into place, so a
part is either whole or absent; a restart reads the ids of the parts present and embeds only the
others. `_embed_corpus.json` records which model and outputs made the parts, so a restart with
another model cannot mix two vector spaces in one directory. Parquet readers skip files whose
names start with `_` or `.`, so `pyarrow.parquet.read_table(OUTPUT)` reads the parts alone.

Columns: the input's id column, then per requested output
- `dense`: fixed_size_list<float32>[dim]
- `sparse`: list<struct<index: int32, value: float32>>, ascending token ids (TEI's `/embed_sparse` shape)
- `colbert`: list<fixed_size_list<float32>[dim]>, `num_tokens - 1` vectors (CLS dropped)
and `num_tokens` (int32, special tokens included).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.json as pj
import pyarrow.parquet as pq

from prensa.stages import contract

JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet", ".pq")
RECORD_FILE = "_embed_corpus.json"
PART_PATTERN = re.compile(r"^part-(\d+)\.parquet$")


class CorpusError(ValueError):
    """An input or output directory the run cannot use; the message says why."""


@dataclass(frozen=True)
class Columns:
    id: str = "id"
    text: str = "text"


@dataclass(frozen=True)
class CorpusInput:
    """One JSONL or Parquet file, or a directory of them (one format), read in sorted file order."""

    files: tuple[Path, ...]
    format: str  # "json" (one object per line) or "parquet"

    @classmethod
    def find(cls, path: Path) -> CorpusInput:
        if not path.exists():
            raise CorpusError(f"{path} does not exist")
        candidates = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        by_format = {
            "json": [p for p in candidates if p.suffix.lower() in JSON_SUFFIXES],
            "parquet": [p for p in candidates if p.suffix.lower() in PARQUET_SUFFIXES],
        }
        found = {name: files for name, files in by_format.items() if files}
        if len(found) != 1:
            raise CorpusError(
                f"{path}: expected JSONL ({', '.join(JSON_SUFFIXES)}) or Parquet "
                f"({', '.join(PARQUET_SUFFIXES)}) files of one format"
            )
        ((name, files),) = found.items()
        return cls(tuple(files), name)

    def parse_options(self, columns: Columns) -> pj.ParseOptions:
        """How to read the JSON input. pyarrow reads JSON strings that look like dates as
        timestamps: a text, and an id inferred so, is read as the string it is, so that
        "2024-01-01" comes back as written (and never equals "2024-01-01T00:00:00")."""
        inferred = pds.dataset([str(f) for f in self.files], format="json").schema
        fields = [
            pa.field(name, pa.string())
            if name == columns.text or (name == columns.id and _temporal(inferred.field(name).type))
            else inferred.field(name)
            for name in inferred.names
        ]
        return pj.ParseOptions(explicit_schema=pa.schema(fields))

    def dataset(self, columns: Columns) -> pds.Dataset:
        """The input as one dataset, its ids and texts read as they are written."""
        paths = [str(f) for f in self.files]
        if self.format != "json":
            return pds.dataset(paths, format=self.format)
        options = self.parse_options(columns)
        json_format = pds.JsonFileFormat(parse_options=options)
        return pds.dataset(paths, format=json_format, schema=options.explicit_schema)

    def fault(self, columns: Columns, schema: pa.Schema | None) -> str | None:
        """Where a JSON input first breaks, as `file:line: what`: a line that is not a JSON object, or
        an id or text of another type than the input's first ones (pyarrow counts rows from its
        block, and names no file). `schema` is what pyarrow read, None when it read nothing."""
        kinds: dict[str, tuple[type, ...] | None] = {columns.text: (str,), columns.id: None}
        if schema is not None and columns.id in schema.names:
            kinds[columns.id] = _json_kind(schema.field(columns.id).type)
        for path in self.files if self.format == "json" else ():
            with path.open("rb") as lines:
                for number, line in enumerate(lines, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as exc:
                        return f"{path}:{number}: not JSON ({exc.msg} at character {exc.pos + 1})"
                    if not isinstance(row, dict):
                        return f"{path}:{number}: a JSON {type(row).__name__}, not an object"
                    for name, allowed in kinds.items():
                        value = row.get(name)
                        if value is None:
                            continue
                        if allowed is None:  # the first id read: what the others must be
                            kinds[name] = _json_kind(pa.scalar(value).type)
                        elif allowed and not _is(value, allowed):
                            return (
                                f"{path}:{number}: {name!r} is {json.dumps(value)[:60]}, where the "
                                f"input's first rows hold {_described(allowed)}"
                            )
        return None


def _temporal(kind: pa.DataType) -> bool:
    return bool(pa.types.is_temporal(kind))


def _json_kind(kind: pa.DataType) -> tuple[type, ...]:
    """The Python types a JSON value of an inferred arrow type comes as (none: not checked)."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or _temporal(kind):
        return (str,)
    if pa.types.is_integer(kind):
        return (int,)
    if pa.types.is_floating(kind):
        return (int, float)
    if pa.types.is_boolean(kind):
        return (bool,)
    return ()


def _is(value: object, allowed: tuple[type, ...]) -> bool:
    """`value` is of an allowed JSON type (a bool is no number)."""
    return isinstance(value, allowed) and (bool in allowed or not isinstance(value, bool))


def _described(allowed: tuple[type, ...]) -> str:
    return {str: "strings", int: "integers", float: "numbers", bool: "booleans"}[allowed[-1]]


@contextmanager
def located(corpus: CorpusInput, columns: Columns, schema: pa.Schema | None) -> Iterator[None]:
    """pyarrow's error on a broken input, named by file and line where that can be found."""
    try:
        yield
    except pa.ArrowInvalid as exc:
        where = corpus.fault(columns, schema)
        raise CorpusError(where or f"{', '.join(map(str, corpus.files))}: {exc}") from exc


def read_ids(corpus: CorpusInput, columns: Columns) -> pa.Array:
    """Every id of the input, refusing missing columns, texts that are not strings, null ids and
    duplicates before any work."""
    with located(corpus, columns, None):  # its first lines do not parse
        dataset = corpus.dataset(columns)
    names = dataset.schema.names
    missing = [c for c in (columns.id, columns.text) if c not in names]
    if missing:
        raise CorpusError(
            f"the input has no column {', '.join(map(repr, missing))} "
            f"(columns: {', '.join(names)}); see --id-column / --text-column"
        )
    text_type = dataset.schema.field(columns.text).type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
        raise CorpusError(f"the input's {columns.text!r} column holds {text_type}, not text")
    with located(corpus, columns, dataset.schema):
        table = dataset.to_table(columns=[columns.id])
    ids = table.column(columns.id).combine_chunks()
    if ids.null_count:
        raise CorpusError(f"{ids.null_count} rows have no {columns.id!r}")
    counts = pc.value_counts(ids)
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    if len(repeated):
        shown = ", ".join(f"{row['values']!r} x{row['counts']}" for row in repeated.to_pylist()[:5])
        raise CorpusError(
            f"{len(repeated)} ids occur more than once in the input, e.g. {shown}; ids must be unique "
            "so that a resumed run can tell what is done"
        )
    return ids


def require_texts(rows: pa.Table | pa.RecordBatch, columns: Columns) -> None:
    """Every row has a text, and none is empty: the server refuses an empty input, as TEI does
    (whitespace alone is a text, embedded by both)."""
    texts = rows.column(columns.text)
    if texts.null_count:
        first = rows.column(columns.id)[pc.index(pc.is_null(texts), True).as_py()]
        raise CorpusError(f"row {first.as_py()!r} has no {columns.text!r}")
    empty = pc.equal(pc.utf8_length(texts), 0)
    if pc.any(empty).as_py():
        first = rows.column(columns.id)[pc.index(empty, True).as_py()]
        raise CorpusError(
            f"row {first.as_py()!r} has an empty {columns.text!r}: an empty input is refused, as "
            "the server refuses it; drop the row or give it text"
        )


def drop_done(
    batch: pa.RecordBatch | pa.Table, done: pa.Array, column: str
) -> pa.RecordBatch | pa.Table:
    """`batch` (a record batch or table) without the rows whose `column` value is in `done`."""
    return batch.filter(pc.invert(pc.is_in(batch.column(column), value_set=done)))


def iter_chunks(
    corpus: CorpusInput, columns: Columns, done: pa.Array, rows: int
) -> Iterator[pa.Table]:
    """Tables of `rows` rows (the last may be shorter) of id and text, in input order, without `done` ids."""
    pending: list[pa.RecordBatch] = []
    held = 0
    dataset = corpus.dataset(columns)
    for batch in _batches(corpus, columns, dataset):
        if len(done):
            batch = drop_done(batch, done, columns.id)
        require_texts(batch, columns)
        pending.append(batch)
        held += batch.num_rows
        while held >= rows:
            table = pa.Table.from_batches(pending).combine_chunks()
            yield table.slice(0, rows)
            rest = table.slice(rows)
            pending, held = rest.to_batches(), rest.num_rows
    if held:
        yield pa.Table.from_batches(pending).combine_chunks()


def _batches(
    corpus: CorpusInput, columns: Columns, dataset: pds.Dataset
) -> Iterator[pa.RecordBatch]:
    with located(corpus, columns, dataset.schema):
        yield from dataset.to_batches(columns=[columns.id, columns.text])


def _floats(values: npt.NDArray[Any]) -> pa.Array:
    return pa.array(np.ascontiguousarray(values, dtype=np.float32).ravel())


def _offsets(counts: npt.NDArray[Any]) -> pa.Array:
    return pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))


def dense_column(dense: npt.NDArray[Any]) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(_floats(dense), dense.shape[1])


def sparse_column(ids: npt.NDArray[Any], weights: npt.NDArray[Any]) -> pa.Array:
    """Padded `sparse_ids` / `sparse_weights` (id -1 = padding) -> one list of {index, value} per row."""
    keep = ids >= 0
    terms = pa.StructArray.from_arrays(
        [pa.array(ids[keep].astype(np.int32)), _floats(weights[keep])], names=["index", "value"]
    )
    return pa.ListArray.from_arrays(_offsets(keep.sum(axis=1)), terms)


def colbert_column(vectors: npt.NDArray[Any], num_tokens: npt.NDArray[Any]) -> pa.Array:
    """Per row its `num_tokens - 1` vectors; the zero rows padding the request are dropped."""
    counts = np.maximum(num_tokens.reshape(-1) - 1, 0)
    keep = np.arange(vectors.shape[1])[None, :] < counts[:, None]
    inner = pa.FixedSizeListArray.from_arrays(_floats(vectors[keep]), vectors.shape[2])
    return pa.ListArray.from_arrays(_offsets(counts), inner)


def response_columns(
    response: dict[str, npt.NDArray[Any]], kinds: tuple[str, ...]
) -> dict[str, pa.Array]:
    """One ensemble response (its output tensors by name) as output columns."""
    out: dict[str, pa.Array] = {}
    if "dense" in kinds:
        out["dense"] = dense_column(response[contract.DENSE])
    if "sparse" in kinds:
        out["sparse"] = sparse_column(
            response[contract.SPARSE_IDS], response[contract.SPARSE_WEIGHTS]
        )
    if "colbert" in kinds:
        out["colbert"] = colbert_column(response[contract.COLBERT], response[contract.NUM_TOKENS])
    out[contract.NUM_TOKENS] = pa.array(response[contract.NUM_TOKENS].reshape(-1).astype(np.int32))
    return out


def to_table(
    ids: pa.Array,
    id_column: str,
    responses: list[dict[str, npt.NDArray[Any]]],
    kinds: tuple[str, ...],
) -> pa.Table:
    """Output rows for `ids`; `responses` cover consecutive slices of them, in order."""
    parts = [response_columns(response, kinds) for response in responses]
    columns = {name: pa.concat_arrays([part[name] for part in parts]) for name in parts[0]}
    table = pa.table({id_column: ids, **columns})
    if table.num_rows != len(ids) or any(len(c) != len(ids) for c in columns.values()):
        raise CorpusError(
            f"{len(ids)} ids but {min(len(c) for c in columns.values())} embedded rows"
        )
    return table


@dataclass(frozen=True)
class Resume:
    done: pa.Array  # ids already in complete parts
    next_part: int  # number of the next `part-NNNNN.parquet`
    removed: list[str]  # leftovers of an interrupted run that were deleted


def open_output(out: Path, record: dict[str, Any], id_type: pa.DataType) -> Resume:
    """Create or reopen OUTPUT for a run described by `record`; what is already there, and what was not whole."""
    out.mkdir(parents=True, exist_ok=True)
    record_path = out / RECORD_FILE
    if record_path.exists():
        try:
            previous = json.loads(record_path.read_text())
        except ValueError as exc:
            raise CorpusError(
                f"{record_path} is not readable JSON ({exc}), so the parts beside it cannot be told "
                "apart from another model's: delete the directory, or the file if you know they "
                "are this run's"
            ) from exc
        # the name may differ, the vectors may not
        keys = (record.keys() | previous.keys()) - {"model"}
        changed = sorted(k for k in keys if previous.get(k) != record.get(k))
        if changed:
            raise CorpusError(
                f"{out} holds parts of another run (different {', '.join(changed)}: "
                f"{ {k: previous.get(k) for k in changed} }); write to a new directory"
            )
    elif any(out.glob("*.parquet")):
        raise CorpusError(f"{out} already holds Parquet files not written by `prensa embed-corpus`")
    write_atomically(record_path, (json.dumps(record, indent=2) + "\n").encode())
    removed = [p.name for p in out.glob(".*.tmp")]
    for name in removed:
        (out / name).unlink()
    ids, highest = [], -1
    for path in sorted(out.glob("*.parquet")):
        try:
            ids.append(pq.read_table(path, columns=[record["id_column"]]).column(0))
        except (pa.ArrowInvalid, OSError):  # no footer: a worker stopped while writing it
            path.unlink()
            removed.append(path.name)
            continue
        match = PART_PATTERN.match(path.name)
        highest = max(highest, int(match.group(1))) if match else highest
    done = (
        pa.chunked_array(ids, type=id_type).combine_chunks() if ids else pa.array([], type=id_type)
    )
    if len(pc.unique(done)) != len(done):
        raise CorpusError(
            f"{out}: some ids appear in more than one part; two runs wrote the directory at once"
        )
    return Resume(done, highest + 1, removed)


def write_atomically(final: Path, data: bytes | Callable[[BinaryIO], None]) -> Path:
    """Write to a hidden temporary file beside `final`, flush it to disk, then rename: the file
    appears whole or not at all, whenever the writer dies."""
    temporary = final.parent / f".{final.name}.tmp"
    with open(temporary, "wb") as handle:
        if isinstance(data, bytes):
            handle.write(data)
        else:
            data(handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, final)
    return final


def write_part(out: Path, index: int, table: pa.Table) -> Path:
    """Part `index`, whole or absent."""
    return write_atomically(
        out / f"part-{index:05d}.parquet", lambda handle: pq.write_table(table, handle)
    )
