// The client-side TLS flags shared by Ember's command-line tools
// (ember-trainer, ember-healthcheck): --tls, --tls_ca, --tls_cert,
// --tls_key, --tls_server_name. A binary that links this gets the flags.
#pragma once

#include "common/tls.h"

namespace ember {

// The flags' values, after absl::ParseCommandLine.
ClientTlsOptions ClientTlsFromFlags();

}  // namespace ember
