#!/usr/bin/env bash
# Build the specgate image from the repository's Dockerfile with no registry at all.
#
#   deploy/image/build.sh                      # -> localhost/specgate:<version>
#   deploy/image/build.sh -t specgate:dev      # another tag
#   deploy/image/build.sh --base python:3.12.8-slim-bookworm   # a base you can pull
#   deploy/image/build.sh --lab                # + the lab tools -> localhost/specgate-lab:<version>
#
# Without --base, a minimal Debian (bookworm) base with Python 3.11, pip and venv is made
# locally by mmdebstrap from Debian's own mirror (about 20 s, 250 MB) and kept as
# localhost/specgate-base:bookworm for the next build. The Dockerfile is built unchanged,
# by buildah when installed (daemonless, as root or rootless), else by docker.
# Python packages come from PyPI. Behind a TLS-inspecting proxy the build trusts the
# host's CA store (/etc/ssl/certs is mounted read-only into the build steps; buildah only).
set -euo pipefail
cd "$(dirname "$0")/../.."

version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
tag=""
lab=false
base=""
base_tag="localhost/specgate-base:bookworm"
while [ $# -gt 0 ]; do
  case "$1" in
    -t|--tag) tag="$2"; shift 2 ;;
    --base) base="$2"; shift 2 ;;
    --lab) lab=true; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$tag" ]; then
  if [ "$lab" = true ]; then tag="localhost/specgate-lab:${version}"; else tag="localhost/specgate:${version}"; fi
fi

if command -v buildah >/dev/null 2>&1; then
  builder=buildah
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  builder=docker
else
  echo "need buildah (apt-get install buildah) or a running docker daemon" >&2
  exit 1
fi

have_image() {
  if [ "$builder" = buildah ]; then buildah inspect --type image "$1" >/dev/null 2>&1
  else docker image inspect "$1" >/dev/null 2>&1; fi
}

if [ -z "$base" ]; then
  base="$base_tag"
  if ! have_image "$base"; then
    command -v mmdebstrap >/dev/null 2>&1 || { echo "need mmdebstrap (apt-get install mmdebstrap) or --base IMAGE" >&2; exit 1; }
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    echo "making the base image $base with mmdebstrap (Debian bookworm, python3) ..."
    mmdebstrap --quiet --variant=minbase \
      --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
      bookworm "$tmp/rootfs.tar"
    if [ "$builder" = buildah ]; then
      ctr=$(buildah from scratch)
      buildah add --quiet "$ctr" "$tmp/rootfs.tar" / >/dev/null
      buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
      buildah commit --quiet "$ctr" "$base" >/dev/null
      buildah rm "$ctr" >/dev/null
    else
      docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        "$tmp/rootfs.tar" "$base" >/dev/null
    fi
  fi
fi

echo "building $tag on $base with $builder ..."
if [ "$builder" = buildah ]; then
  ca=()
  [ -f /etc/ssl/certs/ca-certificates.crt ] && ca=(--volume /etc/ssl/certs:/etc/ssl/certs:ro)
  buildah build --quiet --isolation chroot --format docker "${ca[@]}" \
    --build-arg "PYTHON_IMAGE=$base" --build-arg "SPECGATE_LAB=$lab" -t "$tag" .
else
  docker build --quiet --build-arg "PYTHON_IMAGE=$base" --build-arg "SPECGATE_LAB=$lab" -t "$tag" .
fi
echo "built $tag"
