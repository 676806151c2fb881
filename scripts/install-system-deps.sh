#!/usr/bin/env bash
# Installs the real parts the test suite drives from Debian packages when they are
# missing: Prometheus, nginx, Redis (the replicas' peer channel), and buildah + mmdebstrap (the image is built and run
# without a registry or a daemon). Without root or apt it says what is missing and
# carries on: those tests then skip locally, and fail under CI=true.
set -euo pipefail
missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${missing[*]} (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The packages start services on install where an init system exists; the tests run their own.
  (service prometheus stop; service nginx stop; service redis-server stop) >/dev/null 2>&1 || true
else
  echo "note: ${missing[*]} not installed and cannot install (need root + apt); their tests will skip" >&2
fi
