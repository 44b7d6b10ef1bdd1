// Host-side questions about CUDA devices. No CUDA types: host code and tests
// include this without the CUDA headers.
#pragma once

#include <string>

namespace ember::cuda {

// Number of usable CUDA devices; 0 when there is no GPU or no driver (any
// CUDA error counts as "no GPU"). Safe to call at any time after main starts.
int DeviceCount();

// "cuda:N <name>, <memory> GiB, sm_XY", or the CUDA error when unavailable.
std::string DeviceDescription(int device);

}  // namespace ember::cuda
