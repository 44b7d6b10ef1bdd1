#!/usr/bin/env bash
# Fails if a library of the Python package could bind to another copy of
# gRPC, protobuf, Abseil, OpenSSL, re2 or zlib in the process (TensorFlow
# exports its own into the global scope; docs/python.md, "One C ABI,
# sharing nothing with the frameworks"):
#   tests/checks/c_api_symbols.sh LIBEMBER_C EXTENSION [TF_OPS LIBTENSORFLOW_FRAMEWORK]
# - libember_c.so defines (exports) only ember_* functions; the extension
#   only its PyInit_ entry point; the TF op library nothing.
# - libember_c.so and the extension import only versioned symbols of libc,
#   libstdc++ and libgcc, and unversioned ones of the libraries allowed below
#   (spdlog, fmt and civetweb, which TensorFlow and PyTorch do not carry;
#   the extension also the Python C API and ember_*).
# - The TF op library imports TensorFlow's own symbols (its kernel API passes
#   TensorFlow's absl::Status): every Abseil or protobuf symbol it imports
#   must be defined by the TensorFlow library it links, none by Debian's.
# - ldd lists none of Debian's gRPC, protobuf, Abseil, OpenSSL, re2 or zlib
#   libraries for any of them.
set -euo pipefail
lib="$1"
ext="$2"
ops="${3:-}"
tf_lib="${4:-}"
failed=0
fail() {
  echo "c_api_symbols: $*" >&2
  failed=1
}

forbidden_libs='lib(grpc|gpr|upb|protobuf|absl_|ssl|crypto|re2|z|cares|address_sorting)[.+_-]'
for f in "$lib" "$ext" ${ops:+"$ops"}; do
  [ -f "$f" ] || { fail "$f: no such file"; continue; }
  deps="$(ldd "$f" | awk '{print $1}' | grep -E "^$forbidden_libs" || true)"
  [ -z "$deps" ] || fail "$(basename "$f") links $(echo $deps)"
done

# Dynamic symbols: "name version" of the undefined (U) or defined (D) ones.
symbols() {
  objdump -T "$2" | awk -v want="$1" '
    /^[0-9a-f]+ / {
      und = ($0 ~ /\*UND\*/)
      if ((want == "U") != und) next
      n = split($0, f, /[ \t]+/)
      print f[n], f[n - 1]
    }'
}

# Defined: only the C API (and the extension's entry point).
bad="$(symbols D "$lib" | awk '$1 !~ /^ember_/ {print $1}' | head -20)"
[ -z "$bad" ] || fail "$(basename "$lib") exports more than ember_*: $(echo $bad | c++filt)"
bad="$(symbols D "$ext" | awk '$1 !~ /^PyInit_/ {print $1}' | head -20)"
[ -z "$bad" ] || fail "$(basename "$ext") exports more than PyInit_*: $(echo $bad | c++filt)"
if [ -n "$ops" ]; then
  bad="$(symbols D "$ops" | awk '{print $1}' | grep -v -E '^(_init|_fini)$' | head -20 || true)"
  [ -z "$bad" ] || fail "$(basename "$ops") exports symbols: $(echo $bad | c++filt)"
fi

# Imported: versioned ones are libc's, libstdc++'s and libgcc's; an
# unversioned one must belong to a library allowed here.
allowed_unversioned() {
  c++filt | grep -v -E "spdlog::|fmt::v9::|^mg_|Civet(Server|Handler)|^($1)" |
    grep -v -E '^(__gmon_start__|_ITM_deregisterTMCloneTable|_ITM_registerTMCloneTable)$' || true
}
unversioned() {
  symbols U "$1" | awk '$2 !~ /^\((GLIBC|GLIBCXX|CXXABI|GCC)_/ {print $1}'
}
bad="$(unversioned "$lib" | allowed_unversioned 'NEVER' | head -20)"
[ -z "$bad" ] || fail "$(basename "$lib") imports $(unversioned "$lib" | allowed_unversioned NEVER | wc -l) symbols from the process, e.g. $(echo "$bad" | head -5 | tr '\n' ';')"
bad="$(unversioned "$ext" | allowed_unversioned 'Py|_Py|ember_' | head -20)"
[ -z "$bad" ] || fail "$(basename "$ext") imports symbols from the process, e.g. $(echo "$bad" | head -5 | tr '\n' ';')"

if [ -n "$ops" ]; then
  if [ ! -f "$tf_lib" ]; then
    fail "the TensorFlow library the ops link is not at '$tf_lib'"
  else
    theirs="$(nm -D --defined-only "$tf_lib" | awk '{print $NF}' | sort -u)"
    imported="$(unversioned "$ops" | grep -E '^_ZN?K?4absl|^_ZN?K?6google8protobuf|absl|protobuf' | sort -u || true)"
    missing="$(comm -23 <(echo "$imported" | grep . || true) <(echo "$theirs"))"
    [ -z "$missing" ] || fail "$(basename "$ops") imports Abseil/protobuf symbols TensorFlow does not define: $(echo "$missing" | head -5 | c++filt | tr '\n' ';')"
  fi
fi

if [ "$failed" = 0 ]; then
  echo "c_api_symbols: $(basename "$lib"), $(basename "$ext")${ops:+, $(basename "$ops")}:" \
    "only Ember's API exported; nothing of gRPC, protobuf, Abseil, OpenSSL, re2 or zlib imported or linked"
fi
exit "$failed"
