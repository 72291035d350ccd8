#!/usr/bin/env python3
"""Writes property lists for check.py into a directory (never into the repository).

    fixtures.py debian OUT      the plists Debian ships: rust-plist's test data
                                (librust-plist-dev) and CPython's (libpython3.*-testsuite:
                                TESTDATA, written by Apple's tools, in XML, binary, UTF-16
                                and as a keyed archive; the 3-byte sample of issue #21538)
    fixtures.py generated OUT   made with real tools: plistutil -f bin/xml, plistlib's
                                FMT_BINARY and FMT_XML, and bplist_writer.py (offsets and
                                references of 3, 5, 6 and 7 bytes, 16-byte integers)
"""
import ast
import codecs
import datetime
import glob
import importlib.util
import os
import plistlib
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True  # nothing written beside the scripts
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bplist_writer  # noqa: E402


def debian(out):
    found = 0
    for path in sorted(glob.glob('/usr/share/cargo/registry/plist-*/tests/data/*')):
        shutil.copyfile(path, os.path.join(out, 'rust-plist_' + os.path.basename(path).replace('.pbxproj', '.pbxproj.plist')))
        found += 1
    tests = sorted(glob.glob('/usr/lib/python3*/test/test_plistlib.py'))
    if not tests:
        sys.exit('no /usr/lib/python3*/test/test_plistlib.py: apt-get install libpython3.11-testsuite')
    spec = importlib.util.spec_from_file_location('debian_test_plistlib', tests[-1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = module.TESTDATA
    files = {
        'cpython_testdata_xml.plist': data[plistlib.FMT_XML],
        'cpython_testdata_binary.plist': data[plistlib.FMT_BINARY],
        'cpython_keyed_archive.bplist': data['KEYED_ARCHIVE'],
    }
    # test_xml_encodings: the same document in UTF-16 with a byte-order mark.
    text = data[plistlib.FMT_XML].replace(b'UTF-8', b'utf-16').decode('utf-8')
    files['cpython_testdata_utf16le.plist'] = codecs.BOM_UTF16_LE + text.encode('utf-16-le')
    files['cpython_testdata_utf16be.plist'] = codecs.BOM_UTF16_BE + text.encode('utf-16-be')
    # test_nonstandard_refs_size (CPython issue #21538): 3-byte references and offsets.
    tree = ast.parse(open(tests[-1]).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == 'test_nonstandard_refs_size':
            assign = next(n for n in node.body if isinstance(n, ast.Assign))
            files['cpython_issue21538_3byte_refs.bplist'] = ast.literal_eval(assign.value)
    for name, content in files.items():
        with open(os.path.join(out, name), 'wb') as f:
            f.write(content)
    print('%d rust-plist fixtures, %d from %s' % (found, len(files), tests[-1]))


SAMPLE = {
    'Name': 'Mässig, Maß 😀', 'Empty': '', 'Flag': True, 'Off': False,
    'Small': 7, 'Word': 300, 'Long': 70000, 'Negative': -42, 'Min': -2**63, 'Max': 2**63 - 1,
    'AboveInt64': 2**63, 'Cocoa': 9223372036854775852, 'UInt64Max': 2**64 - 1,
    'Ratio': 0.1, 'Tiny': 5e-324, 'Huge': 1e300, 'NegativeZero': -0.0,
    'When': datetime.datetime(2004, 10, 26, 10, 33, 33), 'Blob': bytes(range(40)),
    'List': [1, 'two', [3.5], {'k': 'v'}], 'Nested': {'Z': 1, 'A': {'deep': True, 'text': 'xyz'}},
}


def generated(out):
    def write(name, content):
        with open(os.path.join(out, name), 'wb') as f:
            f.write(content)

    write('plistlib_sample.xml.plist', plistlib.dumps(SAMPLE, fmt=plistlib.FMT_XML, sort_keys=False))
    write('plistlib_sample.binary.plist', plistlib.dumps(SAMPLE, fmt=plistlib.FMT_BINARY, sort_keys=False))
    many = {'key%04d' % i: ('value %d' % i if i % 3 else i * 1000) for i in range(1200)}
    write('plistlib_1200keys.binary.plist', plistlib.dumps(many, fmt=plistlib.FMT_BINARY, sort_keys=False))
    for size in (3, 5, 6, 7):
        write('writer_offsets%d_refs%d.bplist' % (size, size), bplist_writer.write(SAMPLE, size, size))
    write('writer_offsets3_refs1.bplist', bplist_writer.write(SAMPLE, 3, 1))
    write('writer_offsets5_refs2.bplist', bplist_writer.write(SAMPLE, 5, 2))
    widths = dict(SAMPLE, Small=bplist_writer.Wide(7, 16), Word=bplist_writer.Wide(300, 8),
                  Byte=bplist_writer.Wide(1, 2), NegativeWide=bplist_writer.Wide(-1, 16))
    write('writer_16byte_and_wide_integers.bplist', bplist_writer.write(widths, 3, 3))
    # plistutil (libplist) converts the XML sample to binary and back.
    source = os.path.join(out, 'plistlib_sample.xml.plist')
    for fmt, name in (('bin', 'plistutil_sample.binary.plist'), ('xml', 'plistutil_sample.xml.plist')):
        subprocess.run(['plistutil', '-f', fmt, '-i', source, '-o', os.path.join(out, name)], check=True)
    print('generated in', out)


if __name__ == '__main__':
    if len(sys.argv) != 3 or sys.argv[1] not in ('debian', 'generated'):
        sys.exit(__doc__)
    os.makedirs(sys.argv[2], exist_ok=True)
    {'debian': debian, 'generated': generated}[sys.argv[1]](sys.argv[2])
