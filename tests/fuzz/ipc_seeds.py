#!/usr/bin/env python3
# Writes the fuzz corpus seeds for the interprocess ops (IpcExport, IpcOpenMem,
# IpcCloseMem, IpcOpenEvent) into the folder given, in fuzz_worker.cc's action
# format, as graph_seeds.py does for the graph, tensor map and VMM ops: exports
# of memory (at an allocation's start and inside it) and of interprocess events,
# opens and closes with forged tokens, the wrong kind, a device past the count,
# closes of addresses never opened, an export of kind 7 (refused by the
# validator), and requests whose 64-bit words only a raw slot request can carry
# (tokens of any generation and cell, an event handle of generation 1). Run
# from the repository root:
#   python3 tests/fuzz/ipc_seeds.py tests/fuzz/corpus
import re, struct, hashlib, sys
ops=[m.group(1) for m in re.finditer(r'^ORDO_OP\((\w+),', open('include/ordo/ops.def').read(), re.M)]
idx={n:i for i,n in enumerate(ops)}
def le(v,n): return bytes((v>>(8*i))&0xff for i in range(n))
def arg_small(v): return b'\x00'+le(v,3)          # a word below 2^24
def arg_dev(off): return b'\x01'+le(off,2)         # 0x7000'0000'0000 + off: the checking backend's allocations
def slot_req(op, args, slot=5):
    # Action 6: a well-formed sync request (3-byte or address-like words), no edge, no payload.
    b=b'\x00'+b'\x06'+bytes([slot, idx[op], 0])
    for a in (args+[arg_small(0)]*6)[:6]: b+=a
    return b+b'\x00'
def raw_slot(op, words, slot=6):
    # Action 4: a slot request written whole (any 64-bit words), posted as the guest posts it.
    req=le(0,8)+struct.pack('<HHB3x', idx[op], 0, 0)+b''.join(le(w,8) for w in (list(words)+[0]*6)[:6])
    assert len(req)==64
    return b'\x00'+b'\x04'+bytes([slot])+req+b'\x00'*64+b'\x00'+b'\x00'*9+b'\x00'
def poll(k=7): return b'\x00\x08'+bytes([k])
def call(op, *args): return slot_req(op, list(args))+poll()  # answered before the slot's next request
MEM, EVENT, KIND7 = 0, 1, 7
EV1=1<<32  # the first event of a fresh worker: index 0, generation 1
malloc=call('Malloc', arg_small(4096), arg_small(0))
ipc_event=call('EventCreate', arg_small(6), arg_small(0))  # kEventInterprocess | kEventDisableTiming
def tok(gen, cell): return gen<<32 | cell
seeds={
 'ipc: export an allocation at its start and inside it, close what was never opened, free':
   malloc+call('IpcExport', arg_small(MEM), arg_dev(0))+call('IpcExport', arg_small(MEM), arg_dev(100))
   +call('IpcCloseMem', arg_dev(0))+call('Free', arg_dev(0))+call('IpcExport', arg_small(MEM), arg_dev(0))+poll(),
 'ipc: export of an address in no allocation, and of kind 7':
   call('IpcExport', arg_small(MEM), arg_dev(0))+malloc+call('IpcExport', arg_small(MEM), arg_dev(4096))
   +call('IpcExport', arg_small(KIND7), arg_dev(0))+poll(),
 'ipc: an interprocess event exported, a timed one refused, destroyed':
   ipc_event+raw_slot('IpcExport', [EVENT, EV1])+poll()+call('EventCreate', arg_small(4), arg_small(0))
   +call('EventCreate', arg_small(0), arg_small(0))+raw_slot('IpcExport', [EVENT, EV1 | 1])+poll()
   +raw_slot('EventDestroy', [EV1, 0, 0])+poll()+raw_slot('IpcExport', [EVENT, EV1])+poll(),
 'ipc: forged opens: tokens of any cell and generation, zero secrets, devices past the count':
   malloc+raw_slot('IpcOpenMem', [tok(2, 0), 0x1234, 0])+poll()+raw_slot('IpcOpenMem', [tok(3, 0), 1, 0])+poll()
   +raw_slot('IpcOpenMem', [tok(2, 4096), 1, 0])+poll()+raw_slot('IpcOpenMem', [tok(2, 0), 0, 0])+poll()
   +raw_slot('IpcOpenMem', [tok(2, 0), 1, 2])+poll()+raw_slot('IpcOpenMem', [2**64-1, 2**64-1, 2**64-1])+poll()
   +raw_slot('IpcOpenEvent', [tok(2, 0), 0x1234])+poll()+raw_slot('IpcOpenEvent', [2**64-1, 2**64-1])+poll(),
 'ipc: closes of addresses never opened, then a normal call':
   malloc+raw_slot('IpcCloseMem', [0])+poll()+raw_slot('IpcCloseMem', [2**64-1])+poll()+call('IpcCloseMem', arg_dev(0))
   +call('Null')+poll(),
 'ipc: everything on a ring (slot ops refused there)':
   b''.join(bytes([1,5, idx[op], 0, 0, 0])+b'\x00'+le(300,2)+arg_small(0)*6 for op in
            ('IpcExport','IpcOpenMem','IpcCloseMem','IpcOpenEvent'))+poll(),
}
out=sys.argv[1]
for name,data in seeds.items():
    h=hashlib.sha1(data).hexdigest()
    open(f'{out}/{h}','wb').write(data)
    print(name, h, len(data))
