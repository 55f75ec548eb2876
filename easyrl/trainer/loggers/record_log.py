"""Reads back the record files W&B (``run-<id>.wandb``) and SwanLab (``run-<id>.swanlab``) keep a run in.

Neither library writes what it is logged before ``log`` returns: W&B hands it to its service process, which writes
its file every ~15 s, and SwanLab to a background thread, which writes through an 8 KiB file buffer. A SIGKILL of the
training process takes both down with what they still hold, so a step counts as held by these trackers only once it
is in their file: the W&B and SwanLab loggers read these files to tell the Tracker how far that goes.

The format is LevelDB's log (https://github.com/google/leveldb/blob/main/doc/log_format.md), as both libraries write
it: a 7-byte file header, then 32 KiB blocks of chunks, each a 7-byte header (CRC-32 of its type byte and payload,
payload length, type) and its payload; a record is one FULL chunk, or a FIRST, MIDDLE..., LAST run of chunks; a block
tail too short for a chunk header is zero padding.
"""

import struct
import zlib


BLOCK_SIZE = 32768
HEADER_SIZE = 7  # the file header (ident, magic, version) and each chunk header are both 7 bytes
FULL, LAST = 1, 4  # chunk types that end a record (FIRST = 2 and MIDDLE = 3 continue it)


class RecordFile:
    """One record file, read as its writer extends it: ``new_records`` returns the records completed since its last
    call. A chunk cut short by a kill, or not yet written whole, ends what is read; the next call starts again at the
    record it belongs to."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = HEADER_SIZE  # where the first record not yet returned starts

    def new_records(self) -> list[bytes]:
        try:
            with open(self.path, "rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return []
        records: list[bytes] = []
        chunks: list[bytes] = []
        base = position = self._offset  # offsets in the file; data starts at base
        end = base + len(data)
        while position + HEADER_SIZE <= end:
            room = BLOCK_SIZE - position % BLOCK_SIZE
            if room < HEADER_SIZE:
                position += room
                continue
            start = position - base
            checksum, length, kind = struct.unpack_from("<IHB", data, start)
            payload = data[start + HEADER_SIZE : start + HEADER_SIZE + length]
            if kind == 0 or len(payload) < length or zlib.crc32(bytes([kind]) + payload) != checksum:
                break  # the end of what was written whole
            position += HEADER_SIZE + length
            chunks.append(payload)
            if kind in (FULL, LAST):
                records.append(b"".join(chunks))
                chunks = []
                self._offset = position
        return records


def read_records(path: str) -> list[bytes]:
    """Every whole record of a record file (none when it does not exist)."""
    return RecordFile(path).new_records()
