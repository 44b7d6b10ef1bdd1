#!/usr/bin/env bash
# The include rules between the folders, each a grep that must print
# nothing. Lower layers never include higher ones:
#   common/  <-  kernels/  <-  server/
#   common/  <-  client/   (the trainer library never includes the shard's
#                           code or the storage engines, but for the one
#                           file that holds in-process shards,
#                           client/in_process_channel.cc; of kernels/ it
#                           includes only the optimizer rules and table
#                           configs, which the early fetch replays)
#   the shard core (ember_shard) includes neither gRPC nor the services
# and the public client headers (client/include/ember/) include no
# internals of the client (client/...). Generated protos (ember/v1/...)
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
  '#include "(kernels|server|client|python|bench|tests)/|'"$PUBLIC_CLIENT"
rule "kernels/ includes the shard, the client or a public client header" kernels \
  '#include "(server|client|python|bench|tests)/|'"$PUBLIC_CLIENT"
rule "server/ includes the client library" server \
  '#include "(client|python|bench|tests)/|'"$PUBLIC_CLIENT"
# The in-process channel is the one place the client holds shards: it
# includes the shard's host and the engines' device names, nothing else.
IN_PROCESS='^client/in_process_channel\.cc:[0-9]+:#include "(server/shard_host|server/work_pool|kernels/store_factory)\.h"'
found=$(grep -rnE "${SOURCES[@]}" '#include "(server|python|bench|tests)/' client 2>/dev/null |
  grep -vE "$IN_PROCESS")
if [ -n "$found" ]; then
  echo "layer break: client/ includes the shard"
  echo "$found" | sed 's/^/  /'
  breaks=$((breaks + 1))
fi
# Of kernels/, the client includes the optimizer rules and table configs only.
found=$(grep -rnE "${SOURCES[@]}" '#include "kernels/' client 2>/dev/null |
  grep -vE '#include "kernels/(table_config|table_config_proto|optimizer_rows)\.h"' |
  grep -vE "$IN_PROCESS")
if [ -n "$found" ]; then
  echo "layer break: client/ includes a storage engine"
  echo "$found" | sed 's/^/  /'
  breaks=$((breaks + 1))
fi
rule "a public client header includes a client internal" client/include \
  '#include "client/'

# The shard core (ember_shard, server/CMakeLists.txt) runs without a network.
SHARD_CORE=$(sed -n '/^add_library(ember_shard /,/)/p' server/CMakeLists.txt |
  grep -oE '[a-z_]+\.cc' | sed 's/\.cc$//')
for f in $SHARD_CORE; do
  for src in server/$f.cc server/$f.h; do
    [ -f "$src" ] || continue
    if grep -nE '#include [<"](grpc|grpcpp)/|#include "server/(server|[a-z_]*service|grpc_status|token_auth|inflight_limit|health_check|received_exchange|shard_health)\.h"' "$src" |
        sed "s|^|  $src:|" | grep .; then
      echo "layer break: the shard core ($src) includes gRPC or the server around it"
      breaks=$((breaks + 1))
    fi
  done
done

if [ "$breaks" -gt 0 ]; then
  echo "$breaks layer rule(s) broken"
  exit 1
fi
echo "layers: no include rule broken"
