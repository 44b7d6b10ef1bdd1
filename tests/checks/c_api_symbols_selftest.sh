#!/usr/bin/env bash
# tests/checks/c_api_symbols.sh must refuse a library that links protobuf,
# exports more than the C API and imports a protobuf symbol (built from
# c_api_symbols_leaky.cc), naming each of the three:
#   tests/checks/c_api_symbols_selftest.sh LEAKY_LIBRARY
set -uo pipefail
leaky="$1"
out="$(bash "$(dirname "$0")/c_api_symbols.sh" "$leaky" "$leaky" 2>&1)"
rc=$?
failed=0
expect() {
  grep -q -- "$1" <<< "$out" || { echo "c_api_symbols_selftest: no '$1' in: $out" >&2; failed=1; }
}
[ "$rc" = 1 ] || { echo "c_api_symbols_selftest: exit $rc, expected 1: $out" >&2; failed=1; }
expect "links libprotobuf"
expect "exports more than ember_\*: LeakyNonApiFunction"
expect "imports 1 symbols from the process, e.g. google::protobuf::internal::VersionString"
[ "$failed" = 0 ] && echo "c_api_symbols_selftest: the check refuses a leaky library, naming why"
exit "$failed"
