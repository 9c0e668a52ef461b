#!/usr/bin/env bash
# Make the base image that docker/webshop/Dockerfile builds FROM: a minimal Debian bookworm with
# python3, python3-venv and ca-certificates, made by debootstrap (no container registry is
# reachable on the CI machines, so `FROM debian:bookworm-slim` cannot be pulled there).
#
#   docker/base-image.sh [IMAGE]        # default envrl-base:bookworm; needs root, podman, debootstrap
#
# Idempotent: does nothing when IMAGE exists. The Debian mirror is the one apt's own sources
# name (override with DEBIAN_MIRROR=...). Takes about a minute.
set -euo pipefail

IMAGE=${1:-envrl-base:bookworm}
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates

for tool in podman debootstrap; do
  command -v "$tool" >/dev/null || { echo "base-image.sh: $tool not found (apt-get install podman debootstrap)" >&2; exit 1; }
done

# One builder at a time (tests may run this concurrently); the second finds the image made.
exec 9>"${TMPDIR:-/tmp}/envrl-base-image.lock"
flock 9

if podman image exists "$IMAGE"; then
  echo "base-image.sh: $IMAGE exists"
  exit 0
fi

# The main archive's URI from apt's sources (deb822 *.sources or one-line sources.list),
# the first whose suites include $SUITE itself (not -security / -updates).
mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    awk -v suite="$SUITE" '
      function para() { if (uri != "" && ok) { print uri; found = 1; exit } uri = ""; ok = 0 }
      /^[[:space:]]*$/ { para(); next }
      /^URIs:/ { uri = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite) ok = 1 }
      END { if (!found) para() }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    # deb [options] URI SUITE COMPONENTS...
    sed -E 's/\[[^]]*\]//' "$f" | awk -v suite="$SUITE" '$1 == "deb" && $3 == suite { print $2 }'
  done
}
MIRROR=${DEBIAN_MIRROR:-$(mirror | head -n 1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

ROOT=$(mktemp -d "${TMPDIR:-/tmp}/envrl-base.XXXXXX")
trap 'rm -rf "$ROOT"' EXIT
chmod 755 "$ROOT"  # it becomes the image's "/": mktemp's 0700 would lock out every other user
echo "base-image.sh: debootstrap $SUITE from $MIRROR"
start=$(date +%s)
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 || {
  tail -n 30 "$ROOT.log" >&2; rm -f "$ROOT.log"; exit 1; }
rm -f "$ROOT.log"
# Downloaded packages and package lists are not needed in the image.
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* "$ROOT"/debootstrap
tar -C "$ROOT" --numeric-owner -c . | podman import --quiet \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  - "$IMAGE" >/dev/null
echo "base-image.sh: made $IMAGE in $(( $(date +%s) - start )) s"
