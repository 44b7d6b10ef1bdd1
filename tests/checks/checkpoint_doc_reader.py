"""A checkpoint reader written from docs/checkpoints.md ("Format (version 1)")
alone, with no Ember code: if it reads what ember-server writes, the doc
describes the format. For every checkpoint directory under DIR it checks
the MANIFEST's framing and CRC32C, and reads every data file block by block
as the doc lays them out: the header, rows blocks and removed-keys blocks in
any number and order (possibly none), then the footer, whose counts must
equal the blocks' sums and which must end the file.

    python3 tests/checks/checkpoint_doc_reader.py DIR [--expect-rows N]

Prints one line per checkpoint (kind from the blocks: whether any
removed-keys block was seen) and exits 1 on the first thing the doc does
not predict. --expect-rows: the rows of the newest checkpoint's files
together must be N.
"""

import argparse
import os
import struct
import sys

# ember.v1.DType: bytes per element of the storage dtype.
DTYPE_BYTES = {1: 4, 2: 2, 3: 2}


def crc32c(data: bytes) -> int:
    """CRC32C (Castagnoli, reflected polynomial 0x82F63B78)."""
    table = crc32c.table
    if table is None:
        table = []
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            table.append(c)
        crc32c.table = table
    crc = 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


crc32c.table = None


class Unexpected(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Unexpected(what)


def read_manifest(path):
    data = open(path, "rb").read()
    check(data[:8] == b"EMBERMAN", f"{path}: magic {data[:8]!r}")
    version, length = struct.unpack_from("<II", data, 8)
    check(version == 1, f"{path}: format version {version}")
    check(len(data) == 16 + length + 4, f"{path}: {len(data)} bytes, length field says {length}")
    (stored,) = struct.unpack_from("<I", data, 16 + length)
    check(stored == crc32c(data[:16 + length]), f"{path}: CRC32C mismatch")


def read_data_file(path):
    """(rows, removed keys, rows blocks, removed-keys blocks) of one file."""
    data = open(path, "rb").read()
    check(data[:8] == b"EMBERTBL", f"{path}: magic {data[:8]!r}")
    version, dtype, dim, state_floats, flags, zero = struct.unpack_from("<6I", data, 8)
    check(version == 1 and zero == 0, f"{path}: header version {version}, last field {zero}")
    check(dtype in DTYPE_BYTES, f"{path}: dtype {dtype}")
    has_steps = bool(flags & 1)
    at = 32
    rows = removed = rows_blocks = removed_blocks = 0
    while True:
        check(at + 16 <= len(data), f"{path}: block header past the end at {at}")
        kind, pad, n = struct.unpack_from("<IIQ", data, at)
        check(pad == 0, f"{path}: block at {at}: second field {pad}")
        at += 16
        if kind == 3:  # footer: u64 rows, u64 removed keys (24 bytes in all)
            (footer_removed,) = struct.unpack_from("<Q", data, at)
            at += 8
            check(at == len(data), f"{path}: {len(data) - at} bytes after the footer")
            check((n, footer_removed) == (rows, removed),
                  f"{path}: footer says {n} rows, {footer_removed} removed; blocks held "
                  f"{rows}, {removed}")
            return rows, removed, rows_blocks, removed_blocks
        if kind == 1:
            size = n * 8 + n * dim * DTYPE_BYTES[dtype] + n * state_floats * 4 + n * 4
            if has_steps:
                size += n * 4
            size += -size % 8  # zeros to a multiple of 8 bytes
            check(at + size <= len(data), f"{path}: rows block of {n} past the end")
            at += size
            rows += n
            rows_blocks += 1
        elif kind == 2:
            check(at + n * 8 <= len(data), f"{path}: removed-keys block of {n} past the end")
            at += n * 8
            removed += n
            removed_blocks += 1
        else:
            raise Unexpected(f"{path}: block kind {kind} at {at - 16}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--expect-rows", type=int)
    args = p.parse_args()
    checkpoints = sorted(d for d in os.listdir(args.dir)
                         if not d.startswith(".") and os.path.isdir(os.path.join(args.dir, d)))
    if not checkpoints:
        print(f"no checkpoint in {args.dir}", file=sys.stderr)
        return 1
    newest_rows = 0
    try:
        for name in checkpoints:
            path = os.path.join(args.dir, name)
            read_manifest(os.path.join(path, "MANIFEST"))
            files = sorted(f for f in os.listdir(path) if f.endswith(".rows"))
            totals = [read_data_file(os.path.join(path, f)) for f in files]
            rows = sum(t[0] for t in totals)
            removed_blocks = sum(t[3] for t in totals)
            empty = sum(1 for f in files if os.path.getsize(os.path.join(path, f)) == 32 + 24)
            print(f"ok   {name}: {len(files)} data files, {rows} rows, "
                  f"{sum(t[1] for t in totals)} removed keys in {removed_blocks} blocks, "
                  f"{empty} files of header and footer alone")
            newest_rows = rows
    except Unexpected as e:
        print(f"FAIL the doc does not predict: {e}", file=sys.stderr)
        return 1
    if args.expect_rows is not None and newest_rows != args.expect_rows:
        print(f"FAIL the newest checkpoint holds {newest_rows} rows, expected {args.expect_rows}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
