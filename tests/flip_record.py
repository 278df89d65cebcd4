#!/usr/bin/env python3
"""Flip one byte of a torch.save record's data in place, leaving its zip headers (and the
CRC-32 they record) as they were: what --crc must find.

usage: flip_record.py FILE [AT [MASK]]
FILE: a torch.save archive, or a .distcp file of them; the first local record whose name ends
with /data/0 is changed: its data byte AT (default 0) XORed with MASK (default 0x80).
"""
import struct
import sys


def main():
    path = sys.argv[1]
    at = int(sys.argv[2], 0) if len(sys.argv) > 2 else 0
    mask = int(sys.argv[3], 0) if len(sys.argv) > 3 else 0x80
    with open(path, 'rb') as f:
        b = bytearray(f.read())
    i = 0
    while True:
        i = b.index(b'PK\x03\x04', i)   # ValueError: no such record
        nl, xl = struct.unpack_from('<HH', b, i + 26)
        if bytes(b[i + 30:i + 30 + nl]).endswith(b'/data/0'):
            break
        i += 4
    b[i + 30 + nl + xl + at] ^= mask
    with open(path, 'wb') as f:
        f.write(b)


if __name__ == '__main__':
    main()
