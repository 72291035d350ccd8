#!/usr/bin/env python3
"""A small binary property-list writer whose offset and reference sizes are chosen by the
caller, for testing readers against legal files that plistlib and Core Foundation never
write themselves (an encoder in the wild writes 3-byte sizes: CPython issue #21538).

The layout (Apple's bplist00, as CFBinaryPList.c reads it):

    "bplist00"                      8-byte header
    objects                         each object once, in the order they are met (no sharing)
    offset table                    one big-endian offset per object, OFFSET_SIZE bytes each
    trailer, 32 bytes:
        6 bytes  zero               (5 unused bytes, then the sort version, 0)
        1 byte   OFFSET_SIZE        1..8: the width of each offset-table entry
        1 byte   REF_SIZE           1..8: the width of each object reference in a container
        8 bytes  object count       big-endian
        8 bytes  top object         index of the root (0 here)
        8 bytes  offset-table start big-endian byte offset

Objects: 0x08/0x09 false/true; 0x1N integer of 2^N bytes (N 0..2 unsigned, 3 signed
8-byte, 4 signed 16-byte, which Core Foundation writes for 2^63 <= v < 2^64); 0x23 double;
0x33 date (double seconds since 2001-01-01); 0x4N data; 0x5N ASCII string; 0x6N UTF-16BE
string (N counts UTF-16 units); 0xAN array of N references; 0xDN dictionary of N key
references then N value references. A count of 15 or more is 0xXF followed by an integer
object. Any size 1..8 is legal: a reader must take the width from the trailer.

Usage as a module: write(value, offset_size=3, ref_size=3) -> bytes. `Wide(v, width)`
forces an integer's width (1, 2, 4, 8 or 16 bytes). As a program:
    bplist_writer.py OFFSET_SIZE REF_SIZE < plist (any plistlib format) > bplist
"""
import datetime
import struct
import sys


class Wide:
    """An integer to be written in exactly `width` bytes."""

    def __init__(self, value, width):
        assert width in (1, 2, 4, 8, 16)
        self.value, self.width = value, width


def _int_object(value, width=None):
    if width is None:
        if value < 0:
            width = 8
        elif value < 1 << 8:
            width = 1
        elif value < 1 << 16:
            width = 2
        elif value < 1 << 32:
            width = 4
        elif value < 1 << 63:
            width = 8
        else:
            width = 16
    marker = 0x10 | {1: 0, 2: 1, 4: 2, 8: 3, 16: 4}[width]
    signed = width >= 8
    return bytes([marker]) + value.to_bytes(width, 'big', signed=signed)


def _count(marker, n):
    if n < 15:
        return bytes([marker | n])
    return bytes([marker | 0x0F]) + _int_object(n)


def write(value, offset_size=1, ref_size=1):
    assert 1 <= offset_size <= 8 and 1 <= ref_size <= 8
    objects = []  # encoded bodies, with references still to fill in

    def add(v):
        index = len(objects)
        objects.append(None)
        if isinstance(v, bool):
            objects[index] = b'\x09' if v else b'\x08'
        elif isinstance(v, Wide):
            objects[index] = _int_object(v.value, v.width)
        elif isinstance(v, int):
            objects[index] = _int_object(v)
        elif isinstance(v, float):
            objects[index] = b'\x23' + struct.pack('>d', v)
        elif isinstance(v, datetime.datetime):
            seconds = (v - datetime.datetime(2001, 1, 1)).total_seconds()
            objects[index] = b'\x33' + struct.pack('>d', seconds)
        elif isinstance(v, (bytes, bytearray)):
            objects[index] = _count(0x40, len(v)) + bytes(v)
        elif isinstance(v, str):
            if v.isascii():
                objects[index] = _count(0x50, len(v)) + v.encode('ascii')
            else:
                units = v.encode('utf-16-be')
                objects[index] = _count(0x60, len(units) // 2) + units
        elif isinstance(v, (list, tuple)):
            refs = [add(item) for item in v]
            objects[index] = _count(0xA0, len(refs)) + b''.join(r.to_bytes(ref_size, 'big') for r in refs)
        elif isinstance(v, dict):
            keys = [add(k) for k in v.keys()]
            values = [add(item) for item in v.values()]
            objects[index] = _count(0xD0, len(keys)) + b''.join(r.to_bytes(ref_size, 'big') for r in keys + values)
        else:
            raise TypeError(type(v))
        return index

    add(value)
    out = bytearray(b'bplist00')
    offsets = []
    for body in objects:
        offsets.append(len(out))
        out += body
    table = len(out)
    for offset in offsets:
        out += offset.to_bytes(offset_size, 'big')
    out += bytes(6) + bytes([offset_size, ref_size])
    out += struct.pack('>QQQ', len(objects), 0, table)
    return bytes(out)


if __name__ == '__main__':
    import plistlib
    value = plistlib.loads(sys.stdin.buffer.read())
    sys.stdout.buffer.write(write(value, int(sys.argv[1]), int(sys.argv[2])))
