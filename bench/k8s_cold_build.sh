#!/usr/bin/env bash
# Cold build times of single dev-cluster binaries: each built alone with an EMPTY Go build
# cache (GOCACHE=$(mktemp -d)), the shared module cache and no network (GOPROXY=off: downloads
# are not counted), with the flags hack/ensure-k8s.sh uses (its --print-ldflags), under
# nice -n 19, one at a time.
# Prints /usr/bin/time -v's wall/user/sys/peak RSS, the build cache's size afterwards, and
# whether the binary is byte-identical to the one in hack/ensure-k8s.sh's cache (it is when the
# flags match). Each build cache is deleted afterwards (2-3 GiB each).
#
# Usage: bench/k8s_cold_build.sh [helm] [kubelet] [kube-controller-manager] ...
# Needs the modules downloaded once (hack/ensure-k8s.sh has done it).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mods="$here/hack/k8s"
cached="$("$here/hack/ensure-k8s.sh" --check 2>/dev/null | tail -n 1)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(( $# )) || set -- helm kubelet kube-controller-manager
for name in "$@"; do
  case "$name" in
    kubelet) dir=kubelet; pkg=k8s.io/kubernetes/cmd/kubelet ;;
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl)
      dir=kubernetes; pkg="k8s.io/kubernetes/cmd/$name" ;;
    helm) dir=helm; pkg=helm.sh/helm/v3/cmd/helm ;;
    *) echo "unknown binary: $name" >&2; exit 2 ;;
  esac
  ld="$("$here/hack/ensure-k8s.sh" --print-ldflags "$name")" || exit 2
  gocache="$(mktemp -d "$work/gocache.XXXX")"
  echo "== $name: start $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd "$mods/$dir" && env GOCACHE="$gocache" GOPROXY=off CGO_ENABLED=0 GOTOOLCHAIN=local \
     GOFLAGS="-trimpath -mod=readonly" /usr/bin/time -v nice -n 19 go build -ldflags "$ld" \
     -o "$work/$name" "$pkg") >"$work/$name.log" 2>&1
  rc=$?
  echo "   exit $rc, end $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)," \
       "build cache $(du -sh "$gocache" | cut -f1)"
  grep -E "Elapsed|User time|System time|Maximum resident" "$work/$name.log" | sed 's/^\s*/   /'
  (( rc == 0 )) || { tail -n 20 "$work/$name.log"; continue; }
  echo "   binary $(stat -c %s "$work/$name") bytes; identical to $cached/$name:" \
       "$(cmp -s "$work/$name" "$cached/$name" && echo yes || echo no)"
  rm -rf "$gocache" "$work/$name"
done
