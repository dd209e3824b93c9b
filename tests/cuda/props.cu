// Prints what cudaGetDeviceProperties reports, one key=value line per field,
// keyed by the field's CUdevice_attribute number, so run.sh's props case can
// compare it line by line with `ordo-worker --device-info`: the profile the
// worker's backend shows guests.
#include <cuda_runtime.h>

#include <cstdio>

#include "common.cuh"

#define P(attr, field) std::printf("attr.%d=%d\n", int(attr), int(prop.field))

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("name=%s\ntotal_mem=%zu\n", prop.name, prop.totalGlobalMem);
  P(cudaDevAttrMaxThreadsPerBlock, maxThreadsPerBlock);
  P(cudaDevAttrMaxBlockDimX, maxThreadsDim[0]);
  P(cudaDevAttrMaxBlockDimY, maxThreadsDim[1]);
  P(cudaDevAttrMaxBlockDimZ, maxThreadsDim[2]);
  P(cudaDevAttrMaxGridDimX, maxGridSize[0]);
  P(cudaDevAttrMaxGridDimY, maxGridSize[1]);
  P(cudaDevAttrMaxGridDimZ, maxGridSize[2]);
  P(cudaDevAttrMaxSharedMemoryPerBlock, sharedMemPerBlock);
  P(cudaDevAttrTotalConstantMemory, totalConstMem);
  P(cudaDevAttrWarpSize, warpSize);
  P(cudaDevAttrMaxRegistersPerBlock, regsPerBlock);
  P(cudaDevAttrTextureAlignment, textureAlignment);
  P(cudaDevAttrMultiProcessorCount, multiProcessorCount);
  P(cudaDevAttrIntegrated, integrated);
  P(cudaDevAttrCanMapHostMemory, canMapHostMemory);
  P(cudaDevAttrSurfaceAlignment, surfaceAlignment);
  P(cudaDevAttrConcurrentKernels, concurrentKernels);
  P(cudaDevAttrEccEnabled, ECCEnabled);
  P(cudaDevAttrPciBusId, pciBusID);
  P(cudaDevAttrPciDeviceId, pciDeviceID);
  P(cudaDevAttrPciDomainId, pciDomainID);
  P(cudaDevAttrTccDriver, tccDriver);
  P(cudaDevAttrGlobalMemoryBusWidth, memoryBusWidth);
  P(cudaDevAttrL2CacheSize, l2CacheSize);
  P(cudaDevAttrMaxThreadsPerMultiProcessor, maxThreadsPerMultiProcessor);
  P(cudaDevAttrAsyncEngineCount, asyncEngineCount);
  P(cudaDevAttrUnifiedAddressing, unifiedAddressing);
  P(cudaDevAttrTexturePitchAlignment, texturePitchAlignment);
  P(cudaDevAttrComputeCapabilityMajor, major);
  P(cudaDevAttrComputeCapabilityMinor, minor);
  P(cudaDevAttrStreamPrioritiesSupported, streamPrioritiesSupported);
  P(cudaDevAttrGlobalL1CacheSupported, globalL1CacheSupported);
  P(cudaDevAttrLocalL1CacheSupported, localL1CacheSupported);
  P(cudaDevAttrMaxSharedMemoryPerMultiprocessor, sharedMemPerMultiprocessor);
  P(cudaDevAttrMaxRegistersPerMultiprocessor, regsPerMultiprocessor);
  P(cudaDevAttrManagedMemory, managedMemory);
  P(cudaDevAttrIsMultiGpuBoard, isMultiGpuBoard);
  P(cudaDevAttrMultiGpuBoardGroupID, multiGpuBoardGroupID);
  P(cudaDevAttrHostNativeAtomicSupported, hostNativeAtomicSupported);
  P(cudaDevAttrPageableMemoryAccess, pageableMemoryAccess);
  P(cudaDevAttrConcurrentManagedAccess, concurrentManagedAccess);
  P(cudaDevAttrComputePreemptionSupported, computePreemptionSupported);
  P(cudaDevAttrCanUseHostPointerForRegisteredMem, canUseHostPointerForRegisteredMem);
  P(cudaDevAttrCooperativeLaunch, cooperativeLaunch);
  P(cudaDevAttrMaxSharedMemoryPerBlockOptin, sharedMemPerBlockOptin);
  P(cudaDevAttrPageableMemoryAccessUsesHostPageTables, pageableMemoryAccessUsesHostPageTables);
  P(cudaDevAttrDirectManagedMemAccessFromHost, directManagedMemAccessFromHost);
  P(cudaDevAttrMaxBlocksPerMultiprocessor, maxBlocksPerMultiProcessor);
  P(cudaDevAttrMaxPersistingL2CacheSize, persistingL2CacheMaxSize);
  P(cudaDevAttrMaxAccessPolicyWindowSize, accessPolicyMaxWindowSize);
  P(cudaDevAttrReservedSharedMemoryPerBlock, reservedSharedMemPerBlock);
  P(cudaDevAttrHostRegisterSupported, hostRegisterSupported);
  P(cudaDevAttrClusterLaunch, clusterLaunch);
  return 0;
}
