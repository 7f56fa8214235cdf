// NCCL as the CUDA emulator provides it (tests/cuda_emu/include/cuda_emu.h): the declarations
// Tandem's tensor parallelism uses, so that it compiles; the emulator has one device, so no
// communicator is ever made (ncclCommInitAll: ncclInvalidUsage).
#pragma once

#include <cstddef>

#include "cuda_runtime_api.h"

enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};
enum ncclDataType_t { ncclFloat32 = 7 };
enum ncclRedOp_t { ncclSum = 0 };
#define NCCL_REVOKE_DEFAULT 0x00

struct ncclComm;
using ncclComm_t = ncclComm*;

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int count, const int* devices);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int flags);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state);
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
const char* ncclGetErrorString(ncclResult_t result);
