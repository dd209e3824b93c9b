// The implementations behind the generated exports (forwarders.txt,
// forwarders.cc): each takes its exports' parameters, then `per_thread`,
// which is true when called through the _ptds/_ptsz twin. There handle 0 is
// the calling thread's stream, and a synchronous call runs on that stream
// (stream_of_handle). forwarders.cc checks each signature against cuda.h's.
#pragma once

#include "state.h"

namespace ordo::driver {

// mempool.cc
CUresult mem_alloc_async(CUdeviceptr* ptr, size_t size, CUstream s, bool per_thread);
CUresult mem_alloc_from_pool_async(CUdeviceptr* ptr, size_t size, CUmemoryPool pool, CUstream s, bool per_thread);
CUresult mem_free_async(CUdeviceptr ptr, CUstream s, bool per_thread);

// copy.cc
CUresult memcpy_htod(CUdeviceptr dst, const void* src, size_t n, bool per_thread);
CUresult memcpy_dtoh(void* dst, CUdeviceptr src, size_t n, bool per_thread);
CUresult memcpy_dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, bool per_thread);
CUresult memcpy_htod_async(CUdeviceptr dst, const void* src, size_t n, CUstream s, bool per_thread);
CUresult memcpy_dtoh_async(void* dst, CUdeviceptr src, size_t n, CUstream s, bool per_thread);
CUresult memcpy_dtod_async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, bool per_thread);
// cuMemcpy: either side host or device memory, told by the allocations it knows.
CUresult memcpy_unified(CUdeviceptr dst, CUdeviceptr src, size_t n, bool per_thread);
CUresult memcpy_unified_async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, bool per_thread);
CUresult memcpy_peer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                     bool per_thread);
CUresult memcpy_peer_async(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                           CUstream s, bool per_thread);
CUresult memcpy_2d(const CUDA_MEMCPY2D* p, bool per_thread);
CUresult memcpy_2d_async(const CUDA_MEMCPY2D* p, CUstream s, bool per_thread);

// memory.cc
CUresult memset_d8(CUdeviceptr d, unsigned char v, size_t n, bool per_thread);
CUresult memset_d16(CUdeviceptr d, unsigned short v, size_t n, bool per_thread);
CUresult memset_d32(CUdeviceptr d, unsigned int v, size_t n, bool per_thread);
CUresult memset_d8_async(CUdeviceptr d, unsigned char v, size_t n, CUstream s, bool per_thread);
CUresult memset_d16_async(CUdeviceptr d, unsigned short v, size_t n, CUstream s, bool per_thread);
CUresult memset_d32_async(CUdeviceptr d, unsigned int v, size_t n, CUstream s, bool per_thread);
CUresult memset_d2d8(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h, bool per_thread);
CUresult memset_d2d8_async(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s,
                           bool per_thread);

// stream.cc
CUresult stream_synchronize(CUstream stream, bool per_thread);
CUresult stream_query(CUstream stream, bool per_thread);
CUresult stream_wait_event(CUstream stream, CUevent event, unsigned flags, bool per_thread);
CUresult stream_get_flags(CUstream h, unsigned* flags, bool per_thread);
CUresult stream_get_priority(CUstream h, int* priority, bool per_thread);
CUresult stream_get_id(CUstream h, unsigned long long* id, bool per_thread);
CUresult stream_get_ctx(CUstream h, CUcontext* ctx, bool per_thread);
CUresult stream_get_ctx_v2(CUstream h, CUcontext* ctx, CUgreenCtx* green, bool per_thread);
CUresult stream_get_device(CUstream h, CUdevice* dev, bool per_thread);
CUresult launch_host_func(CUstream stream, CUhostFn fn, void* data, bool per_thread);
CUresult stream_add_callback(CUstream stream, CUstreamCallback cb, void* data, unsigned flags, bool per_thread);

// capture.cc
CUresult stream_begin_capture(CUstream h, CUstreamCaptureMode mode, bool per_thread);
CUresult stream_begin_capture_to_graph(CUstream h, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* edges,
                                       size_t n, CUstreamCaptureMode mode, bool per_thread);
CUresult stream_end_capture(CUstream h, CUgraph* out, bool per_thread);
CUresult stream_is_capturing(CUstream h, CUstreamCaptureStatus* status, bool per_thread);
CUresult stream_get_capture_info(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, bool per_thread);
CUresult stream_get_capture_info_v2(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                    const CUgraphNode** deps, size_t* n, bool per_thread);
CUresult stream_get_capture_info_v3(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                    const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* n,
                                    bool per_thread);
CUresult stream_update_capture_dependencies(CUstream h, CUgraphNode* deps, size_t n, unsigned flags, bool per_thread);
CUresult stream_update_capture_dependencies_v2(CUstream h, CUgraphNode* deps, const CUgraphEdgeData* edges, size_t n,
                                               unsigned flags, bool per_thread);

// graph.cc
CUresult graph_launch(CUgraphExec x, CUstream s, bool per_thread);
CUresult graph_upload(CUgraphExec x, CUstream s, bool per_thread);
CUresult graph_instantiate_with_params(CUgraphExec* out, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS* p,
                                       bool per_thread);

// event.cc
CUresult event_record(CUevent event, CUstream stream, bool per_thread);
CUresult event_record_with_flags(CUevent event, CUstream stream, unsigned flags, bool per_thread);

// launch.cc
CUresult launch_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned smem, CUstream stream, void** params, void** extra, bool per_thread);
CUresult launch_kernel_ex(const CUlaunchConfig* config, CUfunction f, void** params, void** extra, bool per_thread);
CUresult launch_cooperative_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned smem, CUstream stream, void** params, bool per_thread);

}  // namespace ordo::driver
