#!/usr/bin/env bash
# Ensure the development cluster's binaries exist: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl and kwok (the control plane), kubelet and containerd 2 with its runc
# shim and ctr (the real node: Debian's containerd 1.6 reads no CDI specs) and helm (the chart
# tests), built from pinned Go modules (hack/k8s/*/go.mod + go.sum) and cached OUTSIDE the
# work tree under keys derived from those module files, so a version bump (or any go.sum change)
# gets a fresh directory and an unchanged checkout never rebuilds.
# The control plane modules (kubernetes, etcd, kwok) share one key; kubelet, containerd and helm each have a
# key of their own and a directory beside it, linked into the control plane's bin directory: a
# change to one of them rebuilds it alone, never the ~15 min control plane.
# Only missing binaries are built: a command added to a tools.go (which is not part of the key:
# it names what is built, go.mod/go.sum fix how) is built into the existing directory alone.
#
# Usage: hack/ensure-k8s.sh [--check] [--print-key] [--print-ldflags BINARY]
#   --check      do not build; exit 1 (listing what is missing on stderr) unless all is cached
#   --print-key  print the control plane's cache key and exit
#   --print-ldflags BINARY  print the -ldflags BINARY is built with and exit (bench/k8s_cold_build.sh)
# Env:   EGPU_K8S_CACHE  cache root (default: $HOME/.cache/elastic-gpu/k8s)
# Output: progress on stderr; the bin directory is the LAST line of stdout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mods="$here/k8s"
check_only=0
print_key=0
print_ldflags=""
while (( $# )); do
  arg="$1"; shift
  case "$arg" in
    --check) check_only=1 ;;
    --print-key) print_key=1 ;;
    --print-ldflags)
      (( $# )) || { echo "ensure-k8s: --print-ldflags needs a binary name" >&2; exit 2; }
      print_ldflags="$1"; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "ensure-k8s: unknown argument: $arg (see --help)" >&2; exit 2 ;;
  esac
done

log() { echo "ensure-k8s: $*" >&2; }
die() { echo "ensure-k8s: ERROR: $*" >&2; exit 1; }

# Versions come from the committed go.mod files: one source of truth.
modver() { # <module dir> <module path>
  local v
  v="$(awk -v m="$2" '$1 == "require" && $2 == m { print $3 } $1 == m { print $2 }' "$mods/$1/go.mod" | head -n1)"
  [[ -n "$v" ]] || die "cannot find $2 in $mods/$1/go.mod"
  echo "$v"
}
k8s_version="$(modver kubernetes k8s.io/kubernetes)"
etcd_version="$(modver etcd go.etcd.io/etcd/server/v3)"
kwok_version="$(modver kwok sigs.k8s.io/kwok)"
kubelet_version="$(modver kubelet k8s.io/kubernetes)"
helm_version="$(modver helm helm.sh/helm/v3)"
containerd_version="$(modver containerd github.com/containerd/containerd/v2)"
major="${k8s_version#v}"; major="${major%%.*}"
minor="${k8s_version#v*.}"; minor="${minor%%.*}"
k8s_ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
ldflags_of() { # <binary>: the -ldflags it is built with
  case "$1" in
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl|kubelet) echo "$k8s_ldflags" ;;
    etcd|kwok|containerd) echo "-s -w" ;;
    helm) echo "$helm_ldflags" ;;
    *) echo "ensure-k8s: unknown binary: $1" >&2; return 2 ;;
  esac
}
if [[ -n "$print_ldflags" ]]; then ldflags_of "$print_ldflags"; exit; fi
modsum() { # <module dir>...: a short hash of their go.mod and go.sum
  local d files=()
  for d in "$@"; do files+=("$mods/$d/go.mod"); done
  for d in "$@"; do files+=("$mods/$d/go.sum"); done
  cat "${files[@]}" | sha256sum | cut -c1-10
}
# The control plane's key hashes its three modules in the order `cat hack/k8s/*/go.mod` once
# listed them (etcd, kubernetes, kwok), so caches built before kubelet and helm came still hit.
key="k8s-${k8s_version}_etcd-${etcd_version}_kwok-${kwok_version}_$(modsum etcd kubernetes kwok)"
if (( print_key )); then echo "$key"; exit 0; fi

cache="${EGPU_K8S_CACHE:-$HOME/.cache/elastic-gpu/k8s}"
root="$cache/$key"
bin="$root/bin"
logs="$root/logs"
kubelet_root="$cache/kubelet-${kubelet_version}_$(modsum kubelet)"
helm_root="$cache/helm-${helm_version}_$(modsum helm)"
containerd_root="$cache/containerd-${containerd_version}_$(modsum containerd)"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)
# name=directory its binary is built in (linked into $bin under the same name)
linked=("kubelet=$kubelet_root/bin" "helm=$helm_root/bin" "containerd=$containerd_root/bin"
        "containerd-shim-runc-v2=$containerd_root/bin" "ctr=$containerd_root/bin")

missing=()
for b in "${binaries[@]}"; do [[ -x "$bin/$b" ]] || missing+=("$b"); done
for spec in "${linked[@]}"; do
  [[ -x "${spec#*=}/${spec%%=*}" && "$(readlink "$bin/${spec%%=*}" 2>/dev/null)" == "${spec#*=}/${spec%%=*}" ]] \
    || missing+=("${spec%%=*}")
done
if (( ${#missing[@]} == 0 )); then echo "$bin"; exit 0; fi
if (( check_only )); then
  log "missing in $bin: ${missing[*]} (run hack/ensure-k8s.sh to build them)"
  echo "$bin"  # still the last stdout line: where they would be
  exit 1
fi

command -v go >/dev/null 2>&1 || die "Go toolchain not found on PATH. Install Go >= 1.26 (https://go.dev/dl/) and re-run; the binaries are built from Go modules."
go_ver="$(go env GOVERSION 2>/dev/null || true)"
[[ "$go_ver" =~ ^go1\.([0-9]+) ]] || die "cannot determine Go version (got '$go_ver')"
(( BASH_REMATCH[1] >= 26 )) || die "Go >= 1.26 is required (found $go_ver); the pinned modules declare 'go 1.26.0'."

mkdir -p "$bin" "$logs" "$kubelet_root/bin" "$helm_root/bin" "$containerd_root/bin"
# Several test runs may call this at once: one builds, the others wait for it.
exec 9>"$root/.lock"
if ! flock -n 9; then
  log "another build holds $root/.lock; waiting"
  flock 9
fi

# One `go build` per module for all of its missing commands: they share one action graph, so
# packages common to several commands compile once and the links overlap. The kubernetes module
# (by far the largest) builds beside the two small ones; nice: the dev machine is small and shared.
build() { # <module dir> <output dir> <ldflags> <name=package>...
  local dir="$1" bin="$2" ldflags="$3"; shift 3
  local names=() pkgs=() spec
  for spec in "$@"; do
    [[ -x "$bin/${spec%%=*}" ]] && continue
    names+=("${spec%%=*}"); pkgs+=("${spec#*=}")
  done
  (( ${#names[@]} )) || return 0
  local logf="$logs/$dir.log" tmp="$bin/.tmp-$dir" start=$SECONDS
  log "building ${names[*]} from the $dir module (log: $logf) ..."
  rm -rf "$tmp"; mkdir -p "$tmp"
  # Several packages: -o DIR/ names each binary after its package. One: name it (etcd's main
  # package is .../server/v3, which go would call "server").
  local out="$tmp/"; (( ${#pkgs[@]} == 1 )) && out="$tmp/${names[0]}"
  # -mod=readonly: the committed go.sum is authoritative; a mismatch is an error, not an update.
  if ! (cd "$mods/$dir" && env CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-trimpath -mod=readonly" \
        nice -n 10 go build -ldflags "$ldflags" -o "$out" "${pkgs[@]}") >"$logf" 2>&1; then
    echo "ensure-k8s: ERROR: building ${names[*]} failed; last lines of $logf:" >&2
    tail -n 40 "$logf" >&2
    rm -rf "$tmp"
    return 1
  fi
  local name
  for name in "${names[@]}"; do
    mv -f "$tmp/$name" "$bin/$name"  # atomic: a half-written binary is never visible
  done
  rmdir "$tmp"
  log "built ${names[*]} in $((SECONDS - start)) s"
}

build kubernetes "$bin" "$k8s_ldflags" \
  kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
  kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
  kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
  kubectl=k8s.io/kubernetes/cmd/kubectl &
k8s_job=$!
small_ok=1
build etcd "$bin" "$(ldflags_of etcd)" etcd=go.etcd.io/etcd/server/v3 || small_ok=0
build kwok "$bin" "$(ldflags_of kwok)" kwok=sigs.k8s.io/kwok/cmd/kwok || small_ok=0
# helm shares few packages with the rest; kubelet shares most of its with the control plane, so it
# builds after it, from the packages that build left in Go's build cache.
build helm "$helm_root/bin" "$helm_ldflags" helm=helm.sh/helm/v3/cmd/helm || small_ok=0
build containerd "$containerd_root/bin" "$(ldflags_of containerd)" \
  containerd=github.com/containerd/containerd/v2/cmd/containerd \
  containerd-shim-runc-v2=github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  ctr=github.com/containerd/containerd/v2/cmd/ctr || small_ok=0
wait "$k8s_job" || small_ok=0
build kubelet "$kubelet_root/bin" "$k8s_ldflags" kubelet=k8s.io/kubernetes/cmd/kubelet || small_ok=0
(( small_ok )) || die "build failed (see above)"
for spec in "${linked[@]}"; do
  ln -sfn "${spec#*=}/${spec%%=*}" "$bin/.tmp-link" && mv -Tf "$bin/.tmp-link" "$bin/${spec%%=*}"
done

cat >"$root/versions.txt" <<EOF
kubernetes $k8s_version
etcd $etcd_version
kwok $kwok_version
kubelet $kubelet_version
helm $helm_version
containerd $containerd_version
go $go_ver
EOF
echo "$bin"
