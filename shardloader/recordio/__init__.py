"""RecordIO datasets that are safe to read from forked, spawned and threaded workers.

``RecordDataset`` returns raw records and ``ImageRecordDataset`` decodes image
records in whichever process reads them. ``pack_images`` and ``pack_records`` write
``.rec``/``.idx`` pairs, and ``thread_safe`` makes Gluon's own record datasets safe to
share between threads.

Reading
    The dataset holds the record positions it parsed from the ``.idx`` file at construction,
    never an open file. Each process opens its own read-only descriptor of the ``.rec`` on its
    first read and remembers its pid; a forked child sees a foreign pid and opens its own. The
    descriptor is not pickled, so the dataset also travels to ``spawn`` workers. Records are
    read with ``os.pread``, which takes the position with every call, so threads share the
    descriptor without a lock and without a seek that another thread could move.

Checks
    RecordIO frames each record as chunks of ``<magic><flag and length><data><zero padding>``.
    MXNet's own reader checks only the magic number and that the bytes can be read, and names
    neither the file nor the record. Here every read checks the whole frame: the magic number,
    the continuation flags (a record starts with flag 0 or 1, continues with 2 and ends with 3),
    that the padding bytes are zero, and that the record ends exactly where the next indexed
    record starts or the file ends, or else where another record starts. The ``.idx`` positions
    are checked against the ``.rec`` size at construction. Errors about file contents are
    ``RecordIOError`` (a ``ValueError``) naming the file, the record index, its key and its byte
    offset. A missing file is ``FileNotFoundError``.

    RecordIO stores no checksum. A damaged byte inside a payload cannot be detected, and neither
    can a length field that changed only within the record's last 4-byte word when the bytes it
    gained or lost are zeros. An image that no longer decodes (PNG checks a CRC per chunk) is
    reported.
"""

from .._errors import RecordIOError
from .reader import ImageRecordDataset, RecordDataset
from .threads import inline_safe, thread_safe
from .writer import pack_images, pack_records

__all__ = [
    "RecordIOError",
    "RecordDataset",
    "ImageRecordDataset",
    "pack_records",
    "pack_images",
    "inline_safe",
    "thread_safe",
]
