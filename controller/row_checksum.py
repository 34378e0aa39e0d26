"""An order-independent checksum of a table's rows, for checking a rewrite lost, doubled
or changed none (``controller.compaction`` checks a compacted file with it)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

_NULL_HASH = 0x9E3779B97F4A7C15
_SALT = 0xD6E8FEB86659FD93


def row_checksum(table: pa.Table) -> int:
    """An order-independent checksum of ``table``'s rows: the sum (mod 2**64) of one
    64-bit hash per row over every column, so any lost, doubled or changed row shows,
    whichever order or files the rows come in. Strings are hashed once per distinct
    value (BLAKE2b), every value salted by its column and mixed with splitmix64, all
    vectorised."""
    import numpy as np

    total = 0
    for batch in table.to_batches():
        accumulated = np.zeros(batch.num_rows, dtype=np.uint64)
        for index, column in enumerate(batch.columns):
            accumulated += _column_hashes(column, np.uint64(_SALT * (index + 1) % (1 << 64)))
        total = (total + int(_mix(accumulated).sum(dtype=np.uint64))) % (1 << 64)
    return total


def _column_hashes(column: pa.Array, salt: np.uint64) -> np.ndarray:
    """One mixed 64-bit value per row of ``column``; ``salt`` tells columns apart."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        # dictionary_encode returns a DictionaryArray; its stub says only Array
        encoded = cast(pa.DictionaryArray, pc.dictionary_encode(column))
        distinct = np.array([int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8)
                                            .digest(), "little")
                             # a dictionary holds no null (nulls are null indices)
                             for value in cast("list[str]", encoded.dictionary.to_pylist())]
                            or [0],
                            dtype=np.uint64)
        raw = distinct[encoded.indices.fill_null(0).to_numpy(zero_copy_only=False)]
    else:
        values = column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        raw = values.astype(np.int64, copy=False).view(np.uint64)
    hashes = _mix(raw ^ salt)
    if column.null_count:
        nulls = column.is_null().to_numpy(zero_copy_only=False)
        null_hash = _mix(np.array([_NULL_HASH], dtype=np.uint64) ^ salt)[0]
        hashes = np.where(nulls, null_hash, hashes)
    return hashes


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise (uint64 arithmetic wraps)."""
    import numpy as np

    x = values.astype(np.uint64)   # a copy: the shifts below work in place
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x
