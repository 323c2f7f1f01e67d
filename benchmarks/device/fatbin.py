"""Zero the GPU code of a shared library, keeping its structure: ``python fatbin.py LIB``.

The ``.nv_fatbin`` section of a CUDA library is a run of containers (a 16-byte header: magic
``0xBA55ED50``, version, header size, size of the entries), each holding entries (a header
with its own size, the kind (1 PTX, 2 ELF), the payload size and the SM version, then the
payload). This walks them, checks that every container ends where its header says, prints
what it found by kind and SM version, and with ``--zero`` overwrites every payload with zeros
in place. Used by ``prepare.sh``: MXNet 1.9.1's kernels are built for sm_50 to sm_86, none of
which runs on an sm_90 GPU, and zeros compress to almost nothing.
"""

from __future__ import annotations

import argparse
import collections
import mmap
import struct
import subprocess
import sys

_MAGIC = 0xBA55ED50
_KINDS = {1: "PTX", 2: "ELF"}


def _section(path: str) -> tuple:
    out = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        fields = line.replace("[ ", "[").split()
        if ".nv_fatbin" in fields:
            i = fields.index(".nv_fatbin")
            return int(fields[i + 3], 16), int(fields[i + 4], 16)  # file offset, size
    raise SystemExit(f"{path} has no .nv_fatbin section")


def walk(path: str, zero: bool) -> collections.Counter:
    start, size = _section(path)
    found: collections.Counter = collections.Counter()
    with open(path, "r+b" if zero else "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_WRITE if zero else mmap.ACCESS_READ)
        pos, end = start, start + size
        while pos + 16 <= end:
            magic, _, header, body = struct.unpack_from("<IHHQ", m, pos)
            if magic != _MAGIC:
                if m[pos : pos + 8] == bytes(8):  # padding between containers
                    pos += 8
                    continue
                raise SystemExit(f"no container at offset {pos:#x} (magic {magic:#x})")
            entry, stop = pos + header, pos + header + body
            while entry < stop:
                kind, _, entry_header, payload = struct.unpack_from("<HHIQ", m, entry)
                (arch,) = struct.unpack_from("<I", m, entry + 28)
                found[(_KINDS.get(kind, f"kind {kind}"), arch)] += payload
                if zero:
                    first = entry + entry_header
                    m[first : first + payload] = bytes(payload)
                entry += entry_header + payload
            if entry != stop:
                raise SystemExit(f"the entries of the container at {pos:#x} overrun it")
            pos = stop
        m.flush()
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("library")
    parser.add_argument("--zero", action="store_true", help="overwrite every payload with zeros")
    args = parser.parse_args()
    for (kind, arch), nbytes in sorted(walk(args.library, args.zero).items()):
        print(f"{kind} sm_{arch}: {nbytes / 2**20:.0f} MiB{' zeroed' if args.zero else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
