#!/usr/bin/env bash
# Debian packages the dev cluster's real kubelet node runs (docs/sandbox.md, "A real kubelet
# node"): runc, busybox-static (the busybox image is made from it) and iproute2 (the CNI
# plugin's `ip`). containerd is not Debian's (1.6 reads no CDI specs): hack/ensure-k8s.sh builds
# containerd 2 from its Go module, as it builds kubelet. Idempotent: returns at once when every command is there.
# Installs with apt-get when root; otherwise, or when apt-get fails, it says what is missing and
# exits 0: the real-node tests then skip with that reason (the rest of the suite does not need
# these packages).
set -uo pipefail

need=()
command -v runc >/dev/null 2>&1 || need+=(runc)
# Only a static busybox works in an image without libraries (Debian's busybox is dynamic).
if command -v dpkg >/dev/null 2>&1; then
  dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
else
  [[ -x /bin/busybox ]] || need+=(busybox-static)
fi
PATH="$PATH:/usr/sbin:/sbin" command -v ip >/dev/null 2>&1 || need+=(iproute2)
(( ${#need[@]} == 0 )) && exit 0

if (( EUID != 0 )); then
  echo "realnode-packages: not root: cannot install ${need[*]}; the real-node tests will skip" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "realnode-packages: no apt-get: install ${need[*]} by hand; the real-node tests will skip" >&2
  exit 0
fi
echo "realnode-packages: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt_install() { apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
if ! apt_install; then
  # A fresh machine may have no package lists yet.
  apt-get update -qq >/dev/null && apt_install \
    || echo "realnode-packages: apt-get could not install ${need[*]}; the real-node tests will skip" >&2
fi
exit 0
