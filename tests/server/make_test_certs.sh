#!/usr/bin/env bash
# Writes a throwaway PKI into DIR for the TLS tests (EC P-256, valid 2 days):
#   ca.pem            the CA that signs the shard's and the client's certificates
#   server.pem/.key   the shard: subjectAltName IP 127.0.0.1 and DNS localhost
#   client.pem/.key   a client certificate signed by ca.pem
#   rogue-ca.pem, rogue.pem/.key   a client certificate from another CA
set -euo pipefail
dir="$1"
mkdir -p "$dir"
cd "$dir"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
ca() {  # name
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 2 -subj "/CN=$1" 2>/dev/null
}
leaf() {  # name ca extensions
  key "$1.key"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$1" 2>/dev/null
  printf '%s\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" \
    -days 2 -extfile "$1.ext" 2>/dev/null
}
ca ca
ca rogue-ca
leaf server ca "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth"
leaf client ca "extendedKeyUsage=clientAuth"
leaf rogue rogue-ca "extendedKeyUsage=clientAuth"
