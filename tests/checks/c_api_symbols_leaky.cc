// A library that breaks every rule tests/checks/c_api_symbols.sh enforces:
// it links Debian's protobuf, exports a symbol beside the C API and imports
// a protobuf symbol from the process. c_api_symbols_selftest.sh checks that
// the check refuses it, so that the check cannot pass by failing to look.
#include <google/protobuf/stubs/common.h>

extern "C" int ember_leaky_api() { return 0; }

int LeakyNonApiFunction() {
  return static_cast<int>(google::protobuf::internal::VersionString(3021012).size());
}
