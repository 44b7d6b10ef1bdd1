#!/usr/bin/env bash
# The include rules between the folders, each a grep that must print
# nothing. Lower layers never include higher ones:
#   common/  <-  kernels/  <-  shard/  <-  server/
#                              shard/  <-  client/
#   (the shard core is below both the gRPC edge and the trainer library,
#   whose in-process channel hosts shards; of kernels/ the client includes
#   only the optimizer rules and table configs, which the early fetch
#   replays: the engines come to it through the shard core)
#   the shard core includes neither gRPC nor the edge around it
# and the public client headers (client/include/ember/) include no
# internals of the client (client/...) and no gRPC. Generated protos (ember/v1/...)
# are below everything. Run by tests/run_tests.sh; prints each break and
# fails if there is one.
set -uo pipefail
cd "$(dirname "$0")/../.."

SOURCES=(--include=*.h --include=*.cc --include=*.cu --include=*.cuh)
breaks=0
rule() {  # rule "what must not happen" folder regex
  local what="$1" dir="$2" pattern="$3" found
  found=$(grep -rnE "${SOURCES[@]}" "$pattern" "$dir" 2>/dev/null)
  if [ -n "$found" ]; then
    echo "layer break: $what"
    echo "$found" | sed 's/^/  /'
    breaks=$((breaks + 1))
  fi
}

# "ember/<name>.h" is a public client header; "ember/v1/..." a generated proto.
PUBLIC_CLIENT='#include "ember/[a-z_]+\.h"'
rule "common/ includes a higher layer" common \
  '#include "(kernels|shard|server|client|python|bench|tests)/|'"$PUBLIC_CLIENT"
rule "kernels/ includes the shard, the client or a public client header" kernels \
  '#include "(shard|server|client|python|bench|tests)/|'"$PUBLIC_CLIENT"
rule "shard/ includes the gRPC edge, the client or a public client header" shard \
  '#include "(server|client|python|bench|tests)/|'"$PUBLIC_CLIENT"
rule "server/ includes the client library" server \
  '#include "(client|python|bench|tests)/|'"$PUBLIC_CLIENT"
rule "client/ includes the gRPC edge" client '#include "(server|python|bench|tests)/'
# Of kernels/, the client includes the optimizer rules and table configs only.
found=$(grep -rnE "${SOURCES[@]}" '#include "kernels/' client 2>/dev/null |
  grep -vE '#include "kernels/(table_config|table_config_proto|optimizer_rows)\.h"')
if [ -n "$found" ]; then
  echo "layer break: client/ includes a storage engine"
  echo "$found" | sed 's/^/  /'
  breaks=$((breaks + 1))
fi
rule "a public client header includes a client internal" client/include \
  '#include "client/'
# A trainer compiles against the public headers without gRPC's: they hold
# TLS options (common/tls_options.h), not credentials (common/tls.h).
rule "a public client header includes gRPC" client/include \
  '#include [<"](grpc|grpcpp)/|#include "common/tls\.h"'

# The shard core (shard/) runs without a network.
found=$(grep -rnE "${SOURCES[@]}" '#include [<"](grpc|grpcpp)/' shard 2>/dev/null)
if [ -n "$found" ]; then
  echo "layer break: the shard core includes gRPC"
  echo "$found" | sed 's/^/  /'
  breaks=$((breaks + 1))
fi

if [ "$breaks" -gt 0 ]; then
  echo "$breaks layer rule(s) broken"
  exit 1
fi
echo "layers: no include rule broken"
