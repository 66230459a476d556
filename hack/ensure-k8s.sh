#!/usr/bin/env bash
# Ensure the development control plane binaries exist: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl and kwok, built from pinned Go modules
# (hack/k8s/*/go.mod + go.sum) and cached OUTSIDE the work tree under a key derived from
# those module files, so a version bump (or any go.sum change) gets a fresh directory and an
# unchanged checkout never rebuilds.
# Only missing binaries are built: a command added to a tools.go (which is not part of the key:
# it names what is built, go.mod/go.sum fix how) is built into the existing directory alone.
#
# Usage: hack/ensure-k8s.sh [--check] [--print-key]
#   --check      do not build; exit 1 (listing what is missing on stderr) unless all is cached
#   --print-key  print the cache key and exit
# Env:   EGPU_K8S_CACHE  cache root (default: $HOME/.cache/elastic-gpu/k8s)
# Output: progress on stderr; the bin directory is the LAST line of stdout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mods="$here/k8s"
check_only=0
print_key=0
for arg in "$@"; do
  case "$arg" in
    --check) check_only=1 ;;
    --print-key) print_key=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
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
sum="$(cat "$mods"/*/go.mod "$mods"/*/go.sum | sha256sum | cut -c1-10)"
key="k8s-${k8s_version}_etcd-${etcd_version}_kwok-${kwok_version}_${sum}"
if (( print_key )); then echo "$key"; exit 0; fi

root="${EGPU_K8S_CACHE:-$HOME/.cache/elastic-gpu/k8s}/$key"
bin="$root/bin"
logs="$root/logs"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)

missing=()
for b in "${binaries[@]}"; do [[ -x "$bin/$b" ]] || missing+=("$b"); done
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

mkdir -p "$bin" "$logs"
# Several test runs may call this at once: one builds, the others wait for it.
exec 9>"$root/.lock"
if ! flock -n 9; then
  log "another build holds $root/.lock; waiting"
  flock 9
fi

major="${k8s_version#v}"; major="${major%%.*}"
minor="${k8s_version#v*.}"; minor="${minor%%.*}"
k8s_ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

# One `go build` per module for all of its missing commands: they share one action graph, so
# packages common to several commands compile once and the links overlap. The kubernetes module
# (by far the largest) builds beside the two small ones; nice: the dev machine is small and shared.
build() { # <module dir> <ldflags> <name=package>...
  local dir="$1" ldflags="$2"; shift 2
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

build kubernetes "$k8s_ldflags" \
  kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
  kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
  kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
  kubectl=k8s.io/kubernetes/cmd/kubectl &
k8s_job=$!
small_ok=1
build etcd "-s -w" etcd=go.etcd.io/etcd/server/v3 || small_ok=0
build kwok "-s -w" kwok=sigs.k8s.io/kwok/cmd/kwok || small_ok=0
wait "$k8s_job" || small_ok=0
(( small_ok )) || die "build failed (see above)"

cat >"$root/versions.txt" <<EOF
kubernetes $k8s_version
etcd $etcd_version
kwok $kwok_version
go $go_ver
EOF
echo "$bin"
