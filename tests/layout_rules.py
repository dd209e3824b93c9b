#!/usr/bin/env python3
"""The layout's include rules (docs/ARCHITECTURE.md, "Map"), checked on every
#include line of the sources:

  include/ordo/        the protocol (layout.h, ops.def, ops.h, status.h,
                       device_info.h, region.h, doorbell.h), the guest API
                       (client.h) and the sim-kernel API (sim.h): includes
                       nothing but include/ordo, so it installs on its own
  src/transport/       both sides: include/ordo and itself
  src/guest/           include/ordo and src/transport; never the worker
  src/worker/          the engine: include/ordo (not client.h), src/transport,
                       itself and its backends; never the guest
  src/worker/backends/X  the same, without the other backends
  src/ivshmem-server/  include/ordo (not client.h), src/transport, itself

A header is found as the compiler finds it: beside the including file, then
under include/, then under src/ (the internal headers' root). A quoted include
found nowhere (a generated or system header) is skipped unless its name is a
header of a part the including part must not reach.

usage: layout_rules.py SOURCE_ROOT   (exit 0: the rules hold; 1: the breaches, listed)
"""
import os
import re
import sys

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
SOURCE_EXT = ('.h', '.hh', '.hpp', '.cc', '.cpp', '.cu', '.cuh', '.def', '.inc')
GUEST_API = 'include/ordo/client.h'


def part_of(rel):
    """The part of the tree a path (relative to the root) belongs to, or None."""
    if rel == GUEST_API:
        return 'guest-api'
    if rel.startswith('include/ordo/'):
        return 'protocol'
    if rel.startswith('src/transport/'):
        return 'transport'
    if rel.startswith('src/guest/'):
        return 'guest'
    m = re.match(r'src/worker/backends/([^/]+)/', rel)
    if m:
        return 'backend:' + m.group(1)
    if rel.startswith('src/worker/'):
        return 'engine'
    if rel.startswith('src/ivshmem-server/'):
        return 'ivshmem-server'
    return None


def allowed(src, dst):
    """May a file of part `src` include a header of part `dst`?"""
    if src == dst:
        return True
    if dst == 'protocol':
        return True  # everyone is built from the protocol
    if dst == 'guest-api':
        return src == 'guest'  # protocol headers included by a guest-api header are 'protocol'
    if dst == 'transport':
        return src in ('guest', 'engine', 'ivshmem-server') or src.startswith('backend:')
    if dst == 'engine':
        return src.startswith('backend:')  # the Backend interface, for each backend
    if dst.startswith('backend:'):
        return src == 'engine'  # make_backend (backend.cc) and serve.cc (--sim-kernels) reach a backend
    return False


WHY = {
    'protocol': 'include/ordo includes only include/ordo (it is installed on its own for guest builds)',
    'transport': 'src/transport is built into both sides: it includes only include/ordo and itself',
    'guest': 'guest code reaches the worker only through include/ordo and src/transport',
    'engine': 'worker code never includes the guest (client.h, src/guest)',
    'ivshmem-server': 'ordo-ivshmem-server shares only include/ordo and src/transport',
}


def why(src):
    if src.startswith('backend:'):
        return 'a backend includes the protocol, the transport, the engine (backend.h) and its own folder only'
    return WHY[src]


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.realpath(sys.argv[1])
    files = []
    for top in ('include/ordo', 'src'):
        for d, _, names in os.walk(os.path.join(root, top)):
            files += [os.path.join(d, n) for n in names if n.endswith(SOURCE_EXT)]
    rel = lambda p: os.path.relpath(p, root).replace(os.sep, '/')
    headers_by_name = {}
    for f in files:
        headers_by_name.setdefault(os.path.basename(f), []).append(rel(f))

    seen_parts = set()
    breaches = []
    for f in sorted(files):
        src = part_of(rel(f))
        if src is None:
            continue
        seen_parts.add(src.split(':')[0])
        with open(f, encoding='utf-8', errors='replace') as fh:
            for lineno, line in enumerate(fh, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                quote, name = m.groups()
                dirs = ([os.path.dirname(f)] if quote == '"' else []) + \
                       [os.path.join(root, 'include'), os.path.join(root, 'src')]
                found = next((os.path.join(d, name) for d in dirs if os.path.isfile(os.path.join(d, name))), None)
                if found:
                    targets = [rel(os.path.realpath(found))]
                elif quote == '"':
                    # Not in the tree as named: only a breach if it names a forbidden header
                    # (reachable through some other include path).
                    targets = [t for t in headers_by_name.get(os.path.basename(name), [])
                               if part_of(t) and not allowed(src, part_of(t))]
                else:
                    targets = []
                for t in targets:
                    dst = part_of(t)
                    if dst is None:
                        breaches.append(f'{rel(f)}:{lineno}: includes {t}, outside include/ordo and src')
                    elif not allowed(src, dst):
                        breaches.append(f'{rel(f)}:{lineno}: includes {t} ({dst}): {why(src)}')
    missing = {'protocol', 'transport', 'guest', 'engine', 'backend', 'ivshmem-server'} - seen_parts
    if missing:
        breaches.append('no sources found for ' + ', '.join(sorted(missing)) +
                        ': the tree no longer matches the map (update this test and docs/ARCHITECTURE.md)')
    for b in breaches:
        print(b)
    if breaches:
        print(f'layout_rules: {len(breaches)} breach(es) of the layout (docs/ARCHITECTURE.md, "Map")')
        return 1
    print(f'layout_rules: {len(files)} files, the include rules hold')
    return 0


if __name__ == '__main__':
    sys.exit(main())
