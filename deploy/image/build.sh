#!/usr/bin/env bash
# Build the sidecar image, tpuscope serve with no JAX inside: `make image` (or deploy/image/build.sh [TAG]).
#
# It needs no base image and no container registry. Its context is made here from:
#   1. Debian bookworm's own python3 packages, unpacked by mmdebstrap without their maintainer scripts:
#      no shell, no package manager to run, about 50 MB. Each package's control file goes under
#      /var/lib/dpkg/status.d/, as distroless images do, so image scanners still see what is inside.
#   2. The project's wheel (python -m build) and its dependencies with the tpu and gpu extras,
#      binary wheels for the image's Python (3.11) and glibc (2.36), installed by pip into
#      /usr/local/lib/python3.11/dist-packages, which Debian's python3 reads.
# Then podman (or docker, or $CONTAINER_ENGINE) builds deploy/image/Containerfile on that context.
# Needs: mmdebstrap (root, or user namespaces for its unshare mode), podman or docker, and this
# project's venv (make setup). It prints the image's name and size.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
version="$("$python" -c 'import tomllib, sys; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$root/pyproject.toml")"
tag="${1:-localhost/tpuscope:$version}"
engine="${CONTAINER_ENGINE:-$(command -v podman || command -v docker || true)}"
[ -n "$engine" ] || { echo "build.sh: no podman or docker here (set CONTAINER_ENGINE)" >&2; exit 2; }
command -v mmdebstrap >/dev/null || { echo "build.sh: needs mmdebstrap (Debian/Ubuntu: apt-get install mmdebstrap)" >&2; exit 2; }
arch="$(uname -m)"
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT

echo "1/3 the base: Debian bookworm's python3, unpacked"
mmdebstrap --quiet --variant=extract --include=python3-minimal,libpython3.11-stdlib \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --extract-hook='mkdir -p "$1/var/lib/dpkg/status.d"; for deb in "$1"/var/cache/apt/archives/*.deb; do
      dpkg-deb --field "$deb" > "$1/var/lib/dpkg/status.d/$(dpkg-deb --field "$deb" Package)"; done' \
  bookworm "$context/rootfs.tar"

echo "2/3 the wheel and its dependencies, for Python 3.11 on glibc 2.36 ($arch)"
# The sdist, then the wheel built from it in a scratch directory: nothing left over in the checkout's build/.
"$python" -m build --outdir "$context/dist" "$root" >"$context/wheel.log" 2>&1 \
  || { cat "$context/wheel.log" >&2; exit 1; }
wheel="$(ls "$context"/dist/tpuscope-*.whl)"
# pip takes a glibc's wheels only when told each tag it may use: manylinux_2_36 (bookworm) down to 2_5.
platforms="$(for minor in $(seq 36 -1 5); do echo "--platform manylinux_2_${minor}_$arch"; done)"
"$python" -m pip install --quiet --no-compile --disable-pip-version-check --target "$context/site-packages" \
  --only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 \
  -c "$root/constraints.txt" $platforms "$wheel[tpu,gpu]" 2>"$context/pip.log" || { cat "$context/pip.log" >&2; exit 1; }
rm -rf "$context/site-packages/bin"  # pip's scripts name this machine's python; the image has its own launcher
cp "$root/deploy/image/Containerfile" "$root/deploy/image/tpuscope" "$context/"

echo "3/3 the image: $engine build"
# podman writes OCI images by default, whose config has no HEALTHCHECK: ask for docker's format.
format=(); [ "$(basename "$engine")" = podman ] && format=(--format docker)
"$engine" build --quiet "${format[@]}" --tag "$tag" --label "org.opencontainers.image.version=$version" "$context" >/dev/null 2>"$context/build.log" \
  || { cat "$context/build.log" >&2; exit 1; }
# The images this one replaces, untagged now, go (only tpuscope's: the label says whose).
"$engine" image prune --force --filter "label=org.opencontainers.image.title=tpuscope" >/dev/null
echo "built $tag: $("$engine" image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1 / 1e6}')"
