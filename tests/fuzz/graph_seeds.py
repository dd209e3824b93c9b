#!/usr/bin/env python3
# Writes the fuzz corpus seeds for the graph ops (GraphCreate, GraphLaunch,
# GraphDestroy) into the folder given: inputs in fuzz_worker.cc's action
# format that create a graph of every step kind, launch and destroy it (also
# before its launches ran), and the refused cases; and tensor map requests
# (TensorMapEncode) that pass and that are refused, and kernel attribute
# requests (KernelAttributes, KernelOccupancy), and virtual memory requests
# (Vmm*: the checking backend starts its reservations at 2 MiB). Run from the
# repository root.
import re, struct, hashlib, os, sys
ops=[m.group(1) for m in re.finditer(r'^ORDO_OP\((\w+),', open('include/ordo/ops.def').read(), re.M)]
idx={n:i for i,n in enumerate(ops)}
def le(v,n): return bytes((v>>(8*i))&0xff for i in range(n))
def arg_small(v): return b'\x00'+le(v,3)
def slot_req(op, args, slot=5, extra=b''):
    b=b'\x00'+b'\x06'+bytes([slot, idx[op], 0])
    for a in args: b+=a
    b+=b'\x00'
    return b+extra
def ring_entry(ring, op, stream, args):
    b=bytes([ring,5, idx[op], 0, 0, 0])
    b+=b'\x00'+le(stream,2)
    for a in args: b+=a
    return b
def poll(k=7): return b'\x00\x08'+bytes([k])
DEV=0x7000_0000_0000
def steps(kind):
    out=b''
    def step(k, body): return struct.pack('<II',k,len(body))+body
    if 'memset' in kind: out+=step(2, struct.pack('<QQQ', DEV, 5, 64))
    if 'kernel' in kind: out+=step(1, struct.pack('<II6III', 3, 0, 1,1,1, 1,1,1, 8, 0)+b'ABCDEFGH')
    if 'cluster' in kind: out+=step(1, struct.pack('<II6III', 3, 0, 4,1,1, 1,1,1, 8, 1 | 1<<12)+b'ABCDEFGH')
    if 'untiled' in kind: out+=step(1, struct.pack('<II6III', 3, 0, 3,1,1, 1,1,1, 8, 1)+b'ABCDEFGH')
    if 'copy' in kind: out+=step(3, struct.pack('<QQQ', DEV+128, DEV, 64))
    if 'bad' in kind: out+=struct.pack('<II', 9, 8)+b'\0'*8
    if 'past' in kind: out+=step(2, struct.pack('<QQQ', DEV+4090, 5, 64))
    return out
def graph_create(st, off=16):
    return slot_req('GraphCreate', [arg_small(0)]*6, extra=le(off,2)+le(len(st),2)+st)
malloc=slot_req('Malloc',[arg_small(4096), arg_small(0)]+[arg_small(0)]*4)
stream=ring_entry(1,'StreamCreate',300,[arg_small(0)]*6)
def launch(g, ring=1): return ring_entry(ring,'GraphLaunch',300,[arg_small(g)]+[arg_small(0)]*5)
def destroy(g, n): return slot_req('GraphDestroy',[arg_small(g), arg_small(n)]+[arg_small(0)]*4)
seeds={
 'all three kinds, launched twice, destroyed': malloc+poll()+graph_create(steps('memset kernel copy'))+poll()+stream+poll()+launch(1)+launch(1)+poll()+destroy(1,2)+poll(),
 'destroy before its launches are dispatched': malloc+poll()+graph_create(steps('kernel'))+poll()+stream+launch(1)+destroy(1,3)+poll()+launch(1)+poll()+launch(1)+poll(),
 'bad step kind refused': malloc+poll()+graph_create(steps('memset bad'))+poll()+stream+launch(1)+poll(),
 'memset past the allocation': malloc+poll()+graph_create(steps('past'))+poll()+stream+launch(1)+poll(),
 'a cooperative cluster kernel step': malloc+poll()+graph_create(steps('cluster'))+poll()+stream+launch(1)+poll()+destroy(1,1)+poll(),
 'a cluster that does not tile the grid refused': malloc+poll()+graph_create(steps('untiled'))+poll()+stream+launch(1)+poll(),
 'launch of a graph never made': stream+poll()+launch(7)+poll(),
 'launch with no allocation': graph_create(steps('copy memset'))+poll()+stream+launch(1)+poll()+destroy(1,0)+poll(),
}
def tensor_map(box0=32, kind=0):
    # TensorMapRequest (transport/tensor_map.h): a 64x64 float tensor in 32x8 boxes.
    r=struct.pack('<8I', kind, 7, 2, 0, 0, 0, 0, 0)+struct.pack('<Q', DEV)
    r+=struct.pack('<5Q', 64, 64, 0, 0, 0)+struct.pack('<4Q', 256, 0, 0, 0)
    r+=struct.pack('<5I', box0, 8, 0, 0, 0)+struct.pack('<5I', 1, 1, 0, 0, 0)
    r+=struct.pack('<6i', 0, 0, 0, 0, 0, 0)+struct.pack('<2I', 0, 0)+b'\0'*128
    assert len(r)==312
    return slot_req('TensorMapEncode', [arg_small(0)]*6, extra=le(len(r),2)+r)
seeds.update({
 'a tiled tensor map': tensor_map()+poll(),
 'a tensor map with a box row of 8 bytes refused': tensor_map(box0=2)+poll(),
 'a replaced address of a map never made': tensor_map(kind=3)+poll(),
})
def kernel_attributes(kernel, device):
    return slot_req('KernelAttributes', [arg_small(kernel), arg_small(device)]+[arg_small(0)]*4)
def kernel_occupancy(kernel, threads, smem, shape, mode, device=0):
    return slot_req('KernelOccupancy', [arg_small(kernel), arg_small(device), arg_small(threads), arg_small(smem), arg_small(shape), arg_small(mode)])
seeds.update({
 'occupancy of a built-in kernel, blocks and pairs': kernel_occupancy(0, 256, 0, 0, 0)+kernel_occupancy(0, 256, 4096, 1, 1)+poll(),
 'occupancy out of range: no threads, a cooperative shape, a 16-block cluster without permission': kernel_occupancy(0, 0, 0, 0, 0)+kernel_occupancy(0, 64, 0, 1<<12, 0)+kernel_occupancy(0, 64, 0, 15, 1)+poll(),
 'a built-in kernel\'s attributes': kernel_attributes(0, 0)+poll(),
 'attributes of a kernel never looked up, and of a device past the count': kernel_attributes(4000, 0)+kernel_attributes(0, 40)+poll(),
})
G=2<<20
def vmm(op, *args):
    a=[arg_small(v) for v in args]
    return slot_req(op, a+[arg_small(0)]*(6-len(a)))+poll()  # answered before the slot's next request
grow=vmm('VmmReserve',4*G)+vmm('VmmCreate',G,0)+vmm('VmmCreate',G,0)+vmm('VmmMap',G,G,1)+vmm('VmmMap',2*G,G,2)+vmm('VmmSetAccess',G,2*G,1,3)
seeds.update({
 'virtual memory: reserve, two mappings side by side, access, unmap both, release, free': grow+vmm('VmmUnmap',G,2*G)+vmm('VmmRelease',1)+vmm('VmmRelease',2)+vmm('VmmAddressFree',G,4*G)+poll(),
 'virtual memory: released while mapped, then unmapped': grow+vmm('VmmRelease',1)+vmm('VmmUnmap',G,G)+poll(),
 'virtual memory left mapped when the session ends': grow+poll(),
 'virtual memory forged: handles never given, ranges never reserved, half a mapping': grow+vmm('VmmMap',3*G,G,9)+vmm('VmmMap',7*G,G,1)+vmm('VmmMap',G,G,1)+vmm('VmmUnmap',G,G//2)+vmm('VmmUnmap',3*G,G)+vmm('VmmSetAccess',G,3*G,1,3)+vmm('VmmAddressFree',G,4*G)+vmm('VmmCreate',G,40)+vmm('VmmRelease',77)+poll(),
})
# Conditional programs: a handle from GraphCondHandle (the checking backend's
# first is 1), declared by a kHandle step, an IF with a memset body holding a
# WHILE with a kernel body, a SWITCH; and the refused: an undeclared handle, a
# body past its conditional, a WHILE with two bodies.
def step(k, body): return struct.pack('<II',k,len(body))+body
def handle(h, default=1, flags=1): return step(4, struct.pack('<QII', h, default, flags))
def cond(h, t, n): return step(5, struct.pack('<QII', h, t, n))
def body(n): return step(6, struct.pack('<II', n, 0))
kern=step(1, struct.pack('<II6III', 3, 0, 1,1,1, 1,1,1, 8, 0)+b'\x01\0\0\0\0\0\0\0')
mset=step(2, struct.pack('<QQQ', DEV, 5, 64))
cond_handle=slot_req('GraphCondHandle',[arg_small(0)]+[arg_small(0)]*5)+poll()
nested=handle(1)+cond(1,0,2)+body(4)+mset+cond(1,1,1)+body(1)+kern+body(0)+cond(1,2,3)+body(1)+mset+body(0)+body(1)+kern
seeds.update({
 'conditionals: IF/ELSE holding a WHILE, a SWITCH, launched twice': malloc+poll()+cond_handle+graph_create(nested)+poll()+stream+poll()+launch(1)+launch(1)+poll()+destroy(1,2)+poll(),
 'conditionals: a handle never declared, a body past its end, a WHILE of two bodies': malloc+poll()+cond_handle+graph_create(cond(1,0,1)+body(0))+poll()+graph_create(handle(1)+cond(1,0,1)+body(5)+mset)+poll()+graph_create(handle(1)+cond(1,1,2)+body(0)+body(0))+poll(),
 'conditionals: a body memset outside any allocation': cond_handle+graph_create(handle(1,0)+cond(1,0,1)+body(1)+mset)+poll()+stream+launch(1)+poll(),
 'conditionals: handles of devices past the count': slot_req('GraphCondHandle',[arg_small(5)]+[arg_small(0)]*5)+poll()+slot_req('GraphCondHandle',[arg_small(1)]+[arg_small(0)]*5)+poll(),
})
out=sys.argv[1]
for name,data in seeds.items():
    h=hashlib.sha1(data).hexdigest()
    open(f'{out}/{h}','wb').write(data)
    print(name, h, len(data))
