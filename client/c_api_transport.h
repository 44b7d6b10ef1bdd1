// What the C ABI's files share: the ShuffleTransport behind an
// ember_transport handle (c_api_transport.cc) and the error convention
// (c_api.cc).
#pragma once

#include "absl/status/status.h"
#include "ember/ember_c.h"
#include "ember/node_shuffle.h"

namespace ember::c_abi {

// Never null for a handle made by ember_transport_create or
// ember_transports_in_process.
ShuffleTransport* TransportOf(ember_transport* transport);

// The C ABI's error convention (c_api.cc): keeps the message for
// ember_last_error and returns the code.
int Fail(const absl::Status& status);

}  // namespace ember::c_abi
